/* KV dump format v1: reader and atomic writer (docs/DESIGN.md 4). */
#include "config.h"
#include "io/dump.h"
#include "io/dump_priv.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "io/h5file.h"
#include "core/half.h"
#include "core/log.h"
#include "core/tensor.h"

/* ---------------------------------------------------------------- shared */

void mkv_dump_dset_name(char *buf, size_t size, int layer, char kind)
{
    snprintf(buf, size, "/layers/%02d/%c", layer, kind);
}

hid_t mkv_h5_f16_type(void)
{
    /* the layout h5py uses for numpy float16 */
    hid_t t = H5Tcopy(H5T_IEEE_F32LE);
    if (t < 0)
        return t;
    if (H5Tset_fields(t, 15, 10, 5, 0, 10) < 0 || H5Tset_precision(t, 16) < 0 ||
        H5Tset_size(t, 2) < 0 || H5Tset_ebias(t, 15) < 0) {
        H5Tclose(t);
        return -1;
    }
    return t;
}

int mkv_dump_dset_dtype(hid_t dset, mkv_dtype *t, char *why, size_t whysize)
{
    hid_t ft = H5Dget_type(dset);
    if (ft < 0) {
        snprintf(why, whysize, "cannot read its type");
        return -1;
    }
    H5T_class_t cls = H5Tget_class(ft);
    size_t size = H5Tget_size(ft);
    int rc = 0;
    if (cls == H5T_FLOAT && (size == 4 || size == 8)) {
        *t = MKV_DTYPE_F32;
    } else if (cls == H5T_FLOAT && size == 2) {
        size_t spos, epos, esize, mpos, msize;
        if (H5Tget_fields(ft, &spos, &epos, &esize, &mpos, &msize) < 0 || esize != 5 || msize != 10) {
            snprintf(why, whysize, "16-bit float type is not IEEE binary16");
            rc = -1;
        }
        *t = MKV_DTYPE_F16;
    } else if (cls == H5T_INTEGER && size == 2 && H5Tget_sign(ft) == H5T_SGN_NONE) {
        char name[32] = "";
        if (mkv_h5_has_attr(dset, "dtype"))
            mkv_h5_attr_get_str(dset, "dtype", name, sizeof name, NULL);
        if (strcmp(name, "bfloat16") != 0) {
            snprintf(why, whysize, "uint16 data without attribute dtype=\"bfloat16\"");
            rc = -1;
        }
        *t = MKV_DTYPE_BF16;
    } else {
        snprintf(why, whysize, "unsupported element type (expected float32, float16 or bfloat16)");
        rc = -1;
    }
    H5Tclose(ft);
    return rc;
}

int mkv_dump_dset_dims(hid_t dset, hsize_t dims[3])
{
    hid_t space = H5Dget_space(dset);
    if (space < 0)
        return -1;
    int rank = H5Sget_simple_extent_ndims(space);
    hsize_t all[H5S_MAX_RANK];
    if (rank >= 0 && H5Sget_simple_extent_dims(space, all, NULL) < 0)
        rank = -1;
    for (int i = 0; i < rank && i < 3; i++)
        dims[i] = all[i];
    H5Sclose(space);
    return rank;
}

int mkv_dump_read_slab(hid_t dset, mkv_dtype t, int h0, int nh, int64_t t0, int64_t nt, int d,
                       float *out, mkv_error *err)
{
    size_t n;
    if (mkv_mul_size3((size_t)nh, (size_t)nt, (size_t)d, &n))
        return mkv_fail(err, MKV_ENOMEM, "read of %d x %" PRId64 " x %d values overflows", nh, nt, d);
    if (n == 0)
        return MKV_OK;
    hsize_t start[3] = {(hsize_t)h0, (hsize_t)t0, 0}, count[3] = {(hsize_t)nh, (hsize_t)nt, (hsize_t)d};
    hid_t fspace = H5Dget_space(dset);
    hid_t mspace = H5Screate_simple(3, count, NULL);
    int rc = MKV_OK;
    if (fspace < 0 || mspace < 0 ||
        H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, NULL, count, NULL) < 0) {
        rc = mkv_fail(err, MKV_EFORMAT, "cannot select [%d:%d, %" PRId64 ":%" PRId64 ", :]",
                      h0, h0 + nh, t0, t0 + nt);
        goto done;
    }
    if (t == MKV_DTYPE_F32) {
        if (mkv_h5_dread(dset, H5T_NATIVE_FLOAT, mspace, fspace, out) < 0)
            rc = mkv_fail(err, MKV_EFORMAT, "read failed (damaged data?)");
    } else {
        /* read the 16-bit words as they are and convert with lib/core/half.c:
         * exact, and faster than HDF5's soft conversion */
        uint16_t *raw = mkv_alloc(n, sizeof(uint16_t), "read buffer", err);
        if (!raw) {
            rc = MKV_ENOMEM;
            goto done;
        }
        hid_t mt = t == MKV_DTYPE_F16 ? mkv_h5_f16_type() : H5Tcopy(H5T_NATIVE_UINT16);
        if (mt < 0 || mkv_h5_dread(dset, mt, mspace, fspace, raw) < 0)
            rc = mkv_fail(err, MKV_EFORMAT, "read failed (damaged data?)");
        else
            mkv_to_f32(t, raw, out, n);
        if (mt >= 0)
            H5Tclose(mt);
        mkv_free(raw);
    }
done:
    if (fspace >= 0)
        H5Sclose(fspace);
    if (mspace >= 0)
        H5Sclose(mspace);
    return rc;
}

/* zlib's largest compression ratio is about 1032:1 */
#define MAX_DEFLATE_RATIO 1100

int mkv_dump_check_extent(hid_t dset, const char *name, int rank, const hsize_t *dims, hsize_t file_size,
                          mkv_error *err)
{
    hid_t t = H5Dget_type(dset);
    size_t esize = t >= 0 ? H5Tget_size(t) : 0;
    if (t >= 0)
        H5Tclose(t);
    if (esize == 0)
        return mkv_fail(err, MKV_EFORMAT, "%s: cannot read its type", name);
    /* in long double: a product of three 64-bit sizes neither overflows
     * nor rounds below the limit */
    long double bytes = (long double)esize;
    char shape[96] = "";
    size_t used = 0;
    for (int i = 0; i < rank; i++) {
        bytes *= (long double)dims[i];
        used += (size_t)snprintf(shape + used, sizeof shape - used, "%s%llu", i ? "," : "",
                                 (unsigned long long)dims[i]);
    }
    if (bytes > (long double)file_size * MAX_DEFLATE_RATIO)
        return mkv_fail(err, MKV_EFORMAT,
                        "%s: shape [%s] claims %.3Lg bytes, more than a file of %llu bytes can hold "
                        "(damaged dimensions?)",
                        name, shape, bytes, (unsigned long long)file_size);
    return MKV_OK;
}

int mkv_dump_read_ints(hid_t dset, int64_t n, int64_t lo, int64_t hi, int32_t *out, int64_t *bad,
                       int64_t *bad_value, mkv_error *err)
{
    *bad = -1;
    if (n == 0)
        return MKV_OK;
    int64_t *v = mkv_alloc((size_t)n, sizeof *v, "index values", err);
    if (!v)
        return MKV_ENOMEM;
    /* int64 holds every stored integer type exactly except uint64 above
     * INT64_MAX, which HDF5 clips to INT64_MAX: outside lo..hi either way */
    if (mkv_h5_dread(dset, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, v) < 0) {
        mkv_free(v);
        return mkv_fail(err, MKV_EFORMAT, "read failed (damaged data?)");
    }
    for (int64_t i = 0; i < n; i++) {
        if (v[i] < lo || v[i] > hi) {
            *bad = i;
            *bad_value = v[i];
            break;
        }
        out[i] = (int32_t)v[i];
    }
    mkv_free(v);
    return MKV_OK;
}

void mkv_dump_meta_init(mkv_dump_meta *m)
{
    memset(m, 0, sizeof *m);
    strcpy(m->k_rope, "post");
    strcpy(m->source, "synthetic");
    snprintf(m->created_by, sizeof m->created_by, "mosaickv %s", PACKAGE_VERSION);
    m->rope_theta = 10000.0;
    m->dtype = MKV_DTYPE_F16;
}

int mkv_dump_check_model(const mkv_dump_meta *m, mkv_error *err)
{
    if (m->n_layers <= 0 || m->n_layers > 1000)
        return mkv_fail(err, MKV_EFORMAT, "n_layers=%d is out of range 1..1000", m->n_layers);
    if (m->n_kv_heads <= 0 || m->n_heads <= 0)
        return mkv_fail(err, MKV_EFORMAT, "n_heads=%d and n_kv_heads=%d must be positive",
                        m->n_heads, m->n_kv_heads);
    if (m->n_heads > 1000000)
        return mkv_fail(err, MKV_EFORMAT, "n_heads=%d is out of range 1..1000000", m->n_heads);
    if (m->n_heads % m->n_kv_heads != 0)
        return mkv_fail(err, MKV_EFORMAT, "n_heads=%d is not a multiple of n_kv_heads=%d",
                        m->n_heads, m->n_kv_heads);
    if (m->head_dim <= 0 || m->head_dim > 4096)
        return mkv_fail(err, MKV_EFORMAT, "head_dim=%d is out of range 1..4096", m->head_dim);
    if (!(m->rope_theta > 0) || !isfinite(m->rope_theta))
        return mkv_fail(err, MKV_EFORMAT, "rope_theta=%g must be finite and positive", m->rope_theta);
    if (strcmp(m->k_rope, "post") != 0 && strcmp(m->k_rope, "pre") != 0)
        return mkv_fail(err, MKV_EFORMAT, "k_rope='%s' must be 'post' or 'pre'", m->k_rope);
    if (strcmp(m->source, "capture") && strcmp(m->source, "import") && strcmp(m->source, "synthetic"))
        return mkv_fail(err, MKV_EFORMAT, "source='%s' must be capture, import or synthetic", m->source);
    return MKV_OK;
}

int mkv_dump_meta_check(const mkv_dump_meta *m, mkv_error *err)
{
    int rc = mkv_dump_check_model(m, err);
    if (rc != MKV_OK)
        return rc;
    if (m->n_tokens <= 0)
        return mkv_fail(err, MKV_EFORMAT, "the number of tokens must be positive (got %" PRId64 ")",
                        m->n_tokens);
    if (m->n_queries < 0)
        return mkv_fail(err, MKV_EFORMAT, "the number of queries must not be negative");
    return MKV_OK;
}

/* ---------------------------------------------------------------- reader */

struct mkv_dump {
    char *path;
    hid_t fid;
    mkv_dump_meta meta;
    hid_t *dsets;          /* [n_layers][3]: k, v, q */
    mkv_dtype *dtypes;     /* same layout */
    hsize_t file_size;     /* bytes */
};

static int kind_index(char kind) { return kind == 'k' ? 0 : kind == 'v' ? 1 : kind == 'q' ? 2 : -1; }

static int open_check_dset(mkv_dump *d, int layer, char kind, int64_t rows, int64_t *len, mkv_error *err)
{
    char name[64], why[128];
    mkv_dump_dset_name(name, sizeof name, layer, kind);
    int idx = layer * 3 + kind_index(kind);
    if (!mkv_h5_has_link(d->fid, name))
        return mkv_fail(err, MKV_EFORMAT, "'%s': missing dataset %s", d->path, name);
    hid_t ds = H5Dopen2(d->fid, name, H5P_DEFAULT);
    if (ds < 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s': %s is not a dataset", d->path, name);
    d->dsets[idx] = ds;
    if (mkv_dump_dset_dtype(ds, &d->dtypes[idx], why, sizeof why))
        return mkv_fail(err, MKV_EFORMAT, "'%s': %s: %s", d->path, name, why);
    hsize_t dims[3];
    int rank = mkv_dump_dset_dims(ds, dims);
    if (rank != 3)
        return mkv_fail(err, MKV_EFORMAT, "'%s': %s has rank %d, expected 3", d->path, name, rank);
    if (*len < 0)
        *len = (int64_t)dims[1];
    if ((int64_t)dims[0] != rows || (int64_t)dims[1] != *len || (int64_t)dims[2] != d->meta.head_dim)
        return mkv_fail(err, MKV_EFORMAT,
                        "'%s': %s has shape [%llu,%llu,%llu], expected [%" PRId64 ",%" PRId64 ",%d] (%s, %s, head_dim)",
                        d->path, name, (unsigned long long)dims[0], (unsigned long long)dims[1],
                        (unsigned long long)dims[2], rows, *len, d->meta.head_dim,
                        kind == 'q' ? "n_heads" : "n_kv_heads", kind == 'q' ? "W" : "T");
    if (mkv_dump_check_extent(ds, name, 3, dims, d->file_size, err))
        return mkv_error_prefix(err, "'%s'", d->path);
    return MKV_OK;
}

static int check_1d(mkv_dump *d, const char *name, int64_t expect, mkv_error *err)
{
    hid_t ds = H5Dopen2(d->fid, name, H5P_DEFAULT);
    if (ds < 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s': %s is not a dataset", d->path, name);
    hsize_t dims[3];
    int rank = mkv_dump_dset_dims(ds, dims);
    hid_t t = H5Dget_type(ds);
    H5T_class_t cls = t >= 0 ? H5Tget_class(t) : H5T_NO_CLASS;
    if (t >= 0)
        H5Tclose(t);
    H5Dclose(ds);
    if (cls != H5T_INTEGER)
        return mkv_fail(err, MKV_EFORMAT, "'%s': %s is not an integer dataset", d->path, name);
    if (rank != 1 || (int64_t)dims[0] != expect)
        return mkv_fail(err, MKV_EFORMAT, "'%s': %s has %s%llu elements, expected %" PRId64,
                        d->path, name, rank == 1 ? "" : "a rank other than 1 or ",
                        rank >= 1 ? (unsigned long long)dims[0] : 0ULL, expect);
    return MKV_OK;
}

int mkv_dump_read_meta(hid_t fid, const char *path, mkv_dump_meta *m, mkv_error *err)
{
    char fmt[64];
    int64_t v;
    mkv_dump_meta_init(m);
    if (!mkv_h5_has_attr(fid, "mkv_format"))
        return mkv_fail(err, MKV_EFORMAT, "'%s' is not a mosaickv dump (no mkv_format attribute)", path);
    if (mkv_h5_attr_get_str(fid, "mkv_format", fmt, sizeof fmt, err))
        return mkv_error_prefix(err, "'%s'", path);
    if (strcmp(fmt, MKV_DUMP_FORMAT) != 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s' is not a raw KV dump (mkv_format is '%s', expected '%s')",
                        path, fmt, MKV_DUMP_FORMAT);
    if (mkv_h5_attr_get_int(fid, "mkv_version", &v, err))
        return mkv_error_prefix(err, "'%s'", path);
    if (v != MKV_DUMP_VERSION)
        return mkv_fail(err, MKV_EFORMAT, "'%s': unsupported mkv_version %" PRId64 " (this build reads version %d)",
                        path, v, MKV_DUMP_VERSION);
    int rc = mkv_dump_read_model_attrs(fid, path, m, err);
    if (rc != MKV_OK)
        return rc;
    if (mkv_h5_attr_get_str(fid, "source", m->source, sizeof m->source, err))
        return mkv_error_prefix(err, "'%s'", path);
    return MKV_OK;
}

int mkv_dump_read_model_attrs(hid_t fid, const char *path, mkv_dump_meta *m, mkv_error *err)
{
    struct { const char *name; int *dst; } ints[] = {
        {"n_layers", &m->n_layers}, {"n_heads", &m->n_heads},
        {"n_kv_heads", &m->n_kv_heads}, {"head_dim", &m->head_dim},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        int64_t v;
        if (mkv_h5_attr_get_int(fid, ints[i].name, &v, err))
            return mkv_error_prefix(err, "'%s'", path);
        if (v < -1000000 || v > 1000000)
            return mkv_fail(err, MKV_EFORMAT, "'%s': %s=%" PRId64 " is out of range", path, ints[i].name, v);
        *ints[i].dst = (int)v;
    }
    if (mkv_h5_attr_get_double(fid, "rope_theta", &m->rope_theta, err) ||
        mkv_h5_attr_get_str(fid, "model", m->model, sizeof m->model, err) ||
        mkv_h5_attr_get_str(fid, "k_rope", m->k_rope, sizeof m->k_rope, err) ||
        mkv_h5_attr_get_str(fid, "created_by", m->created_by, sizeof m->created_by, err))
        return mkv_error_prefix(err, "'%s'", path);
    return MKV_OK;
}

int mkv_dump_open(const char *path, mkv_dump **out, mkv_error *err)
{
    *out = NULL;
    hid_t fid;
    int rc = mkv_h5_open_read(path, &fid, err);
    return rc ? rc : mkv_dump_open_fid(fid, path, out, err);
}

int mkv_dump_open_fid(hid_t fid, const char *path, mkv_dump **out, mkv_error *err)
{
    *out = NULL;
    mkv_dump *d = calloc(1, sizeof *d);
    if (!d || !(d->path = strdup(strcmp(path, "-") == 0 ? "(stdin)" : path))) {
        free(d);
        H5Fclose(fid);
        return mkv_fail(err, MKV_ENOMEM, "out of memory");
    }
    d->fid = fid;
    int rc;
    mkv_dump_meta *m = &d->meta;
    if ((rc = mkv_dump_read_meta(d->fid, d->path, m, err)))
        goto fail;
    if ((rc = mkv_dump_check_model(m, err))) {
        mkv_error_prefix(err, "'%s'", d->path);
        goto fail;
    }
    if (H5Fget_filesize(d->fid, &d->file_size) < 0) {
        rc = mkv_fail(err, MKV_EIO, "'%s': cannot read the file's size", d->path);
        goto fail;
    }
    d->dsets = malloc(sizeof(hid_t) * 3 * (size_t)m->n_layers);
    d->dtypes = calloc(3 * (size_t)m->n_layers, sizeof(mkv_dtype));
    if (!d->dsets || !d->dtypes) {
        rc = mkv_fail(err, MKV_ENOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < 3 * m->n_layers; i++)
        d->dsets[i] = H5I_INVALID_HID;
    int64_t T = -1, W = -1;
    for (int l = 0; l < m->n_layers; l++) {
        if ((rc = open_check_dset(d, l, 'k', m->n_kv_heads, &T, err)) ||
            (rc = open_check_dset(d, l, 'v', m->n_kv_heads, &T, err)) ||
            (rc = open_check_dset(d, l, 'q', m->n_heads, &W, err)))
            goto fail;
    }
    m->n_tokens = T;
    m->n_queries = W;
    m->dtype = d->dtypes[0];
    if (T <= 0) {
        rc = mkv_fail(err, MKV_EFORMAT, "'%s': the dump holds no tokens", d->path);
        goto fail;
    }
    if (!mkv_h5_has_link(d->fid, "/query_pos")) {
        rc = mkv_fail(err, MKV_EFORMAT, "'%s': missing dataset /query_pos", d->path);
        goto fail;
    }
    if ((rc = check_1d(d, "/query_pos", W, err)))
        goto fail;
    m->has_tokens = mkv_h5_has_link(d->fid, "/tokens");
    if (m->has_tokens && (rc = check_1d(d, "/tokens", T, err)))
        goto fail;
    *out = d;
    return MKV_OK;
fail:
    mkv_dump_close(d);
    return rc;
}

const mkv_dump_meta *mkv_dump_meta_of(const mkv_dump *d) { return &d->meta; }
const char *mkv_dump_path(const mkv_dump *d) { return d->path; }

int mkv_dump_read(mkv_dump *d, int layer, char kind, int h0, int nh, int64_t t0, int64_t nt,
                  float *out, mkv_error *err)
{
    const mkv_dump_meta *m = &d->meta;
    int ki = kind_index(kind);
    if (ki < 0)
        return mkv_fail(err, MKV_EUSAGE, "unknown tensor '%c' (expected k, v or q)", kind);
    int heads = kind == 'q' ? m->n_heads : m->n_kv_heads;
    int64_t len = kind == 'q' ? m->n_queries : m->n_tokens;
    if (layer < 0 || layer >= m->n_layers)
        return mkv_fail(err, MKV_EUSAGE, "'%s': layer %d is out of range 0..%d", d->path, layer, m->n_layers - 1);
    if (h0 < 0 || nh < 0 || h0 + nh > heads)
        return mkv_fail(err, MKV_EUSAGE, "'%s': heads %d..%d are out of range 0..%d", d->path, h0,
                        h0 + nh - 1, heads - 1);
    if (t0 < 0 || nt < 0 || t0 + nt > len)
        return mkv_fail(err, MKV_EUSAGE, "'%s': positions %" PRId64 "..%" PRId64 " are out of range 0..%" PRId64,
                        d->path, t0, t0 + nt - 1, len - 1);
    int idx = layer * 3 + ki;
    int rc = mkv_dump_read_slab(d->dsets[idx], d->dtypes[idx], h0, nh, t0, nt, m->head_dim, out, err);
    if (rc) {
        char name[64];
        mkv_dump_dset_name(name, sizeof name, layer, kind);
        mkv_error_prefix(err, "'%s': %s", d->path, name);
    }
    return rc;
}

/* Read the n values of the 1-D integer dataset name, each of which must be
 * in lo..hi; what names one value in errors. */
static int read_int_1d(mkv_dump *d, const char *name, int64_t n, int64_t lo, int64_t hi,
                       const char *what, int32_t *out, mkv_error *err)
{
    hid_t ds = H5Dopen2(d->fid, name, H5P_DEFAULT);
    if (ds < 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s': missing dataset %s", d->path, name);
    int64_t bad, bad_value;
    int rc = mkv_dump_read_ints(ds, n, lo, hi, out, &bad, &bad_value, err);
    H5Dclose(ds);
    if (rc)
        return mkv_error_prefix(err, "'%s': %s", d->path, name);
    if (bad >= 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s': %s: %s %" PRId64 " at index %" PRId64 " is outside %" PRId64
                        "..%" PRId64, d->path, name, what, bad_value, bad, lo, hi);
    return MKV_OK;
}

int mkv_dump_read_tokens(mkv_dump *d, int32_t *out, mkv_error *err)
{
    if (!d->meta.has_tokens)
        return mkv_fail(err, MKV_EFORMAT, "'%s' has no /tokens (source: %s)", d->path, d->meta.source);
    return read_int_1d(d, "/tokens", d->meta.n_tokens, 0, INT32_MAX, "token id", out, err);
}

int mkv_dump_read_finite(mkv_dump *d, int layer, char kind, int h0, int nh, int64_t t0, int64_t nt,
                         float *out, mkv_error *err)
{
    int rc = mkv_dump_read(d, layer, kind, h0, nh, t0, nt, out, err);
    if (rc != MKV_OK)
        return rc;
    const int hd = mkv_dump_meta_of(d)->head_dim;
    int64_t bad = mkv_find_nonfinite(out, (size_t)nh * (size_t)nt * (size_t)hd);
    if (bad < 0)
        return MKV_OK;
    float v = out[bad];
    int64_t row = bad / hd;
    return mkv_fail(err, MKV_EFORMAT, "'%s': /layers/%02d/%c: %s at [%d,%lld,%d]", mkv_dump_path(d),
                    layer, kind, isnan(v) ? "NaN" : v > 0 ? "Inf" : "-Inf", h0 + (int)(row / nt),
                    (long long)(t0 + row % nt), (int)(bad % hd));
}

uint32_t mkv_kv_digest_update(uint32_t crc, const float *x, size_t n)
{
    unsigned char buf[4096];
    size_t fill = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &x[i], 4);
        for (int b = 0; b < 4; b++)
            buf[fill++] = (unsigned char)(bits >> (8 * b));
        if (fill == sizeof buf || i + 1 == n) {
            crc = (uint32_t)crc32(crc, buf, (uInt)fill);
            fill = 0;
        }
    }
    return crc;
}

void mkv_kv_digest_text(uint32_t crc, char text[MKV_KV_DIGEST_TEXT])
{
    snprintf(text, MKV_KV_DIGEST_TEXT, "crc32:%08" PRIx32, crc);
}

int mkv_dump_read_query_pos(mkv_dump *d, int32_t *out, mkv_error *err)
{
    /* a query at position p attends to tokens 0..p */
    return read_int_1d(d, "/query_pos", d->meta.n_queries, 0, d->meta.n_tokens - 1, "position", out, err);
}

int mkv_dump_storage_bytes(mkv_dump *d, uint64_t *stored, uint64_t *raw, mkv_error *err)
{
    *stored = *raw = 0;
    for (int i = 0; i < 3 * d->meta.n_layers; i++) {
        hsize_t dims[3];
        if (mkv_dump_dset_dims(d->dsets[i], dims) != 3)
            return mkv_fail(err, MKV_EFORMAT, "'%s': cannot read dataset sizes", d->path);
        hid_t t = H5Dget_type(d->dsets[i]);
        size_t esize = t >= 0 ? H5Tget_size(t) : 0;
        if (t >= 0)
            H5Tclose(t);
        *raw += (uint64_t)dims[0] * dims[1] * dims[2] * esize;
        *stored += H5Dget_storage_size(d->dsets[i]);
    }
    return MKV_OK;
}

void mkv_dump_close(mkv_dump *d)
{
    if (!d)
        return;
    if (d->dsets)
        for (int i = 0; i < 3 * d->meta.n_layers; i++)
            if (d->dsets[i] >= 0)
                H5Dclose(d->dsets[i]);
    if (d->fid >= 0)
        H5Fclose(d->fid);
    free(d->dsets);
    free(d->dtypes);
    free(d->path);
    free(d);
}

/* ---------------------------------------------------------------- writer */

struct mkv_dump_writer {
    mkv_h5_out out;
    mkv_dump_meta meta;
    hid_t *dsets;          /* [n_layers][3] */
    uint64_t *written;     /* elements written per dataset */
    hid_t tokens, query_pos;
    int tokens_written, query_pos_written;
    hid_t f16;             /* HDF5 type of IEEE half */
};

void mkv_dump_write_opts_init(mkv_dump_write_opts *o)
{
    o->deflate = 4;
    o->chunk_tokens = 1024;
    o->protect = NULL;
}

static hid_t storage_type(mkv_dump_writer *w)
{
    switch (w->meta.dtype) {
    case MKV_DTYPE_F32: return H5T_IEEE_F32LE;
    case MKV_DTYPE_F16: return w->f16;
    case MKV_DTYPE_BF16: return H5T_STD_U16LE;
    }
    return -1;
}

/* Dataset creation: chunked along tokens, shuffle + deflate, no timestamps
 * (the same input must give byte-identical files). */
static hid_t create_dset(hid_t loc, const char *name, hid_t type, int rank, const hsize_t *dims,
                         const hsize_t *chunk, int deflate)
{
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (dcpl < 0)
        return -1;
    H5Pset_obj_track_times(dcpl, 0);
    hsize_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= dims[i];
    if (n > 0) {
        H5Pset_chunk(dcpl, rank, chunk);
        if (deflate > 0) {
            H5Pset_shuffle(dcpl);
            H5Pset_deflate(dcpl, (unsigned)deflate);
        }
    }
    hid_t space = H5Screate_simple(rank, dims, NULL);
    hid_t ds = space >= 0 ? H5Dcreate2(loc, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT) : -1;
    if (space >= 0)
        H5Sclose(space);
    H5Pclose(dcpl);
    return ds;
}

static hid_t create_group(hid_t loc, const char *name)
{
    hid_t gcpl = H5Pcreate(H5P_GROUP_CREATE);
    if (gcpl < 0)
        return -1;
    H5Pset_obj_track_times(gcpl, 0);
    hid_t g = H5Gcreate2(loc, name, H5P_DEFAULT, gcpl, H5P_DEFAULT);
    H5Pclose(gcpl);
    return g;
}

static int write_root_attrs(mkv_dump_writer *w, mkv_error *err)
{
    hid_t f = w->out.fid;
    const mkv_dump_meta *m = &w->meta;
    int rc;
    if ((rc = mkv_h5_attr_put_str(f, "mkv_format", MKV_DUMP_FORMAT, err)) ||
        (rc = mkv_h5_attr_put_int(f, "mkv_version", MKV_DUMP_VERSION, err)) ||
        (rc = mkv_h5_attr_put_str(f, "model", m->model, err)) ||
        (rc = mkv_h5_attr_put_int(f, "n_layers", m->n_layers, err)) ||
        (rc = mkv_h5_attr_put_int(f, "n_heads", m->n_heads, err)) ||
        (rc = mkv_h5_attr_put_int(f, "n_kv_heads", m->n_kv_heads, err)) ||
        (rc = mkv_h5_attr_put_int(f, "head_dim", m->head_dim, err)) ||
        (rc = mkv_h5_attr_put_double(f, "rope_theta", m->rope_theta, err)) ||
        (rc = mkv_h5_attr_put_str(f, "k_rope", m->k_rope, err)) ||
        (rc = mkv_h5_attr_put_str(f, "source", m->source, err)) ||
        (rc = mkv_h5_attr_put_str(f, "created_by", m->created_by, err)))
        return rc;
    return MKV_OK;
}

int mkv_dump_create(const char *path, const mkv_dump_meta *meta, const mkv_dump_write_opts *opts,
                    mkv_dump_writer **out, mkv_error *err)
{
    *out = NULL;
    mkv_dump_write_opts defaults;
    if (!opts) {
        mkv_dump_write_opts_init(&defaults);
        opts = &defaults;
    }
    int rc = mkv_dump_meta_check(meta, err);
    if (rc)
        return rc;
    if (opts->deflate < 0 || opts->deflate > 9)
        return mkv_fail(err, MKV_EUSAGE, "deflate level %d is out of range 0..9", opts->deflate);
    if (opts->chunk_tokens <= 0)
        return mkv_fail(err, MKV_EUSAGE, "chunk length %" PRId64 " must be positive", opts->chunk_tokens);
    if (meta->n_queries > 0 && meta->n_queries > meta->n_tokens)
        return mkv_fail(err, MKV_EFORMAT, "%" PRId64 " queries for %" PRId64 " tokens: a query needs a position",
                        meta->n_queries, meta->n_tokens);

    mkv_dump_writer *w = calloc(1, sizeof *w);
    if (!w)
        return mkv_fail(err, MKV_ENOMEM, "out of memory");
    w->meta = *meta;
    w->tokens = w->query_pos = H5I_INVALID_HID;
    w->f16 = mkv_h5_f16_type();
    size_t nd = 3 * (size_t)meta->n_layers;
    w->dsets = malloc(nd * sizeof(hid_t));
    w->written = calloc(nd, sizeof(uint64_t));
    if (!w->dsets || !w->written || w->f16 < 0) {
        free(w->dsets);
        free(w->written);
        if (w->f16 >= 0)
            H5Tclose(w->f16);
        free(w);
        return mkv_fail(err, MKV_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < nd; i++)
        w->dsets[i] = H5I_INVALID_HID;
    w->out.fid = H5I_INVALID_HID;
    if ((rc = mkv_h5_create(path, opts->protect, &w->out, err))) {
        mkv_dump_abort(w);
        return rc;
    }
    if ((rc = write_root_attrs(w, err)))
        goto fail;

    const mkv_dump_meta *m = &w->meta;
    hid_t type = storage_type(w);
    hsize_t T = (hsize_t)m->n_tokens, W = (hsize_t)m->n_queries, d = (hsize_t)m->head_dim;
    hsize_t ct = (hsize_t)opts->chunk_tokens < T ? (hsize_t)opts->chunk_tokens : T;
    hsize_t cw = (hsize_t)opts->chunk_tokens < W ? (hsize_t)opts->chunk_tokens : (W ? W : 1);
    hid_t layers = create_group(w->out.fid, "layers");
    if (layers < 0) {
        rc = mkv_fail(err, MKV_EIO, "cannot create group /layers");
        goto fail;
    }
    for (int l = 0; l < m->n_layers && rc == MKV_OK; l++) {
        char name[16];
        snprintf(name, sizeof name, "%02d", l);
        hid_t g = create_group(layers, name);
        hsize_t kdims[3] = {(hsize_t)m->n_kv_heads, T, d}, kchunk[3] = {1, ct, d};
        hsize_t qdims[3] = {(hsize_t)m->n_heads, W, d}, qchunk[3] = {1, cw, d};
        if (g >= 0) {
            w->dsets[3 * l + 0] = create_dset(g, "k", type, 3, kdims, kchunk, opts->deflate);
            w->dsets[3 * l + 1] = create_dset(g, "v", type, 3, kdims, kchunk, opts->deflate);
            w->dsets[3 * l + 2] = create_dset(g, "q", type, 3, qdims, qchunk, opts->deflate);
            H5Gclose(g);
        }
        for (int k = 0; k < 3; k++) {
            hid_t ds = w->dsets[3 * l + k];
            if (g < 0 || ds < 0) {
                rc = mkv_fail(err, MKV_EIO, "cannot create /layers/%s", name);
                break;
            }
            if (m->dtype == MKV_DTYPE_BF16 && (rc = mkv_h5_attr_put_str(ds, "dtype", "bfloat16", err)))
                break;
        }
    }
    H5Gclose(layers);
    if (rc)
        goto fail;
    hsize_t c1 = ct;
    if (m->has_tokens && (w->tokens = create_dset(w->out.fid, "tokens", H5T_STD_I32LE, 1, &T, &c1, opts->deflate)) < 0) {
        rc = mkv_fail(err, MKV_EIO, "cannot create /tokens");
        goto fail;
    }
    hsize_t cq = cw;
    if ((w->query_pos = create_dset(w->out.fid, "query_pos", H5T_STD_I32LE, 1, &W, &cq, opts->deflate)) < 0) {
        rc = mkv_fail(err, MKV_EIO, "cannot create /query_pos");
        goto fail;
    }
    *out = w;
    return MKV_OK;
fail:
    mkv_dump_abort(w);
    return rc;
}

int mkv_dump_write(mkv_dump_writer *w, int layer, char kind, int h0, int nh, int64_t t0, int64_t nt,
                   const float *data, mkv_error *err)
{
    const mkv_dump_meta *m = &w->meta;
    int ki = kind_index(kind);
    char name[64];
    if (ki < 0)
        return mkv_fail(err, MKV_EUSAGE, "unknown tensor '%c' (expected k, v or q)", kind);
    mkv_dump_dset_name(name, sizeof name, layer, kind);
    int heads = kind == 'q' ? m->n_heads : m->n_kv_heads;
    int64_t len = kind == 'q' ? m->n_queries : m->n_tokens;
    if (layer < 0 || layer >= m->n_layers || h0 < 0 || nh < 0 || h0 + nh > heads ||
        t0 < 0 || nt < 0 || t0 + nt > len)
        return mkv_fail(err, MKV_EUSAGE, "%s: write of heads %d+%d, positions %" PRId64 "+%" PRId64
                        " is outside [%d, %" PRId64 "]", name, h0, nh, t0, nt, heads, len);
    size_t n;
    if (mkv_mul_size3((size_t)nh, (size_t)nt, (size_t)m->head_dim, &n))
        return mkv_fail(err, MKV_ENOMEM, "%s: write size overflows", name);
    if (n == 0)
        return MKV_OK;
    int64_t bad = mkv_find_nonfinite(data, n);
    if (bad >= 0) {
        int64_t d = m->head_dim;
        return mkv_fail(err, MKV_EFORMAT, "%s: %s at [%" PRId64 ",%" PRId64 ",%" PRId64 "]", name,
                        data[bad] != data[bad] ? "NaN" : data[bad] < 0 ? "-Inf" : "Inf", h0 + bad / (d * nt), t0 + bad / d % nt, bad % d);
    }
    void *buf = (void *)data;
    hid_t mtype = H5T_NATIVE_FLOAT;
    if (m->dtype != MKV_DTYPE_F32) {
        buf = mkv_alloc(n, 2, "write buffer", err);
        if (!buf)
            return MKV_ENOMEM;
        mkv_from_f32(m->dtype, data, buf, n);
        mtype = m->dtype == MKV_DTYPE_F16 ? w->f16 : H5T_NATIVE_UINT16;
    }
    hid_t ds = w->dsets[3 * layer + ki];
    hsize_t start[3] = {(hsize_t)h0, (hsize_t)t0, 0}, count[3] = {(hsize_t)nh, (hsize_t)nt, (hsize_t)m->head_dim};
    hid_t fspace = H5Dget_space(ds);
    hid_t mspace = H5Screate_simple(3, count, NULL);
    int rc = MKV_OK;
    if (fspace < 0 || mspace < 0 ||
        H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, NULL, count, NULL) < 0 ||
        H5Dwrite(ds, mtype, mspace, fspace, H5P_DEFAULT, buf) < 0)
        rc = mkv_fail(err, MKV_EIO, "%s: write failed (disk full?)", name);
    else
        w->written[3 * layer + ki] += n;
    if (fspace >= 0)
        H5Sclose(fspace);
    if (mspace >= 0)
        H5Sclose(mspace);
    if (buf != data)
        mkv_free(buf);
    return rc;
}

static int write_int_1d(hid_t ds, const char *name, const int32_t *v, int *flag, mkv_error *err)
{
    if (ds < 0)
        return mkv_fail(err, MKV_EUSAGE, "%s: the dump was created without it", name);
    if (H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) < 0)
        return mkv_fail(err, MKV_EIO, "%s: write failed", name);
    *flag = 1;
    return MKV_OK;
}

int mkv_dump_write_tokens(mkv_dump_writer *w, const int32_t *tokens, mkv_error *err)
{
    for (int64_t i = 0; i < w->meta.n_tokens; i++)
        if (tokens[i] < 0)
            return mkv_fail(err, MKV_EFORMAT, "/tokens: negative token id %d at %" PRId64, tokens[i], i);
    return write_int_1d(w->tokens, "/tokens", tokens, &w->tokens_written, err);
}

int mkv_dump_write_query_pos(mkv_dump_writer *w, const int32_t *pos, mkv_error *err)
{
    for (int64_t i = 0; i < w->meta.n_queries; i++)
        if (pos[i] < 0 || pos[i] >= w->meta.n_tokens)
            return mkv_fail(err, MKV_EFORMAT, "/query_pos: position %d at %" PRId64 " is outside 0..%" PRId64,
                            pos[i], i, w->meta.n_tokens - 1);
    if (w->meta.n_queries == 0) {
        w->query_pos_written = 1;
        return MKV_OK;
    }
    return write_int_1d(w->query_pos, "/query_pos", pos, &w->query_pos_written, err);
}

int mkv_dump_set_attr(mkv_dump_writer *w, const char *name, const char *value, mkv_error *err)
{
    return mkv_h5_attr_put_str(w->out.fid, name, value, err);
}

static void close_handles(mkv_dump_writer *w)
{
    if (w->dsets)
        for (int i = 0; i < 3 * w->meta.n_layers; i++)
            if (w->dsets[i] >= 0)
                H5Dclose(w->dsets[i]);
    if (w->tokens >= 0)
        H5Dclose(w->tokens);
    if (w->query_pos >= 0)
        H5Dclose(w->query_pos);
    if (w->f16 >= 0)
        H5Tclose(w->f16);
    free(w->dsets);
    free(w->written);
    w->dsets = NULL;
    w->written = NULL;
    w->tokens = w->query_pos = w->f16 = H5I_INVALID_HID;
}

int mkv_dump_commit(mkv_dump_writer *w, mkv_error *err)
{
    const mkv_dump_meta *m = &w->meta;
    int rc = MKV_OK;
    for (int l = 0; l < m->n_layers && !rc; l++)
        for (int k = 0; k < 3 && !rc; k++) {
            uint64_t want = (uint64_t)(k == 2 ? m->n_heads : m->n_kv_heads) *
                            (uint64_t)(k == 2 ? m->n_queries : m->n_tokens) * (uint64_t)m->head_dim;
            if (w->written[3 * l + k] < want) {
                char name[64];
                mkv_dump_dset_name(name, sizeof name, l, "kvq"[k]);
                rc = mkv_fail(err, MKV_EFORMAT, "%s was not completely written", name);
            }
        }
    if (!rc && m->has_tokens && !w->tokens_written)
        rc = mkv_fail(err, MKV_EFORMAT, "/tokens was not written");
    if (!rc && !w->query_pos_written)
        rc = mkv_fail(err, MKV_EFORMAT, "/query_pos was not written");
    if (rc) {
        mkv_dump_abort(w);
        return rc;
    }
    close_handles(w);
    rc = mkv_h5_finish(&w->out, err);
    free(w);
    return rc;
}

void mkv_dump_abort(mkv_dump_writer *w)
{
    if (!w)
        return;
    close_handles(w);
    mkv_h5_discard(&w->out);
    free(w);
}
