/* HDF5 files: clear open errors, pipes and devices through file images,
 * output through core/outfile, attribute helpers. */
#include "config.h"
#include "io/h5file.h"
#include "io/h5heap_priv.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void mkv_h5_quiet(void)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

/* ---------------------------------------------------------------- input */

static int read_all(FILE *fp, unsigned char **buf, size_t *len)
{
    size_t cap = 1 << 20, n = 0;
    unsigned char *b = malloc(cap);
    if (!b)
        return ENOMEM;
    for (;;) {
        if (n == cap) {
            unsigned char *nb = cap > SIZE_MAX / 2 ? NULL : realloc(b, cap * 2);
            if (!nb) {
                free(b);
                return ENOMEM;
            }
            b = nb;
            cap *= 2;
        }
        size_t got = fread(b + n, 1, cap - n, fp);
        n += got;
        if (got == 0) {
            if (ferror(fp)) {
                int e = errno ? errno : EIO;
                free(b);
                return e;
            }
            break;
        }
    }
    *buf = b;
    *len = n;
    return 0;
}

static const unsigned char hdf5_signature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};

int mkv_h5_open_read(const char *path, hid_t *fid, mkv_error *err)
{
    mkv_h5_quiet();
    if (strcmp(path, "-") == 0) {
        unsigned char *buf;
        size_t len;
        int e = read_all(stdin, &buf, &len);
        if (e)
            return mkv_fail_errno(err, MKV_EIO, e, "cannot read standard input");
        if (len == 0) {
            free(buf);
            return mkv_fail(err, MKV_EFORMAT, "standard input is empty");
        }
        if (len < 8 || memcmp(buf, hdf5_signature, 8) != 0) {
            free(buf);
            return mkv_fail(err, MKV_EFORMAT, "standard input is not an HDF5 file");
        }
        /* HDF5 copies the image; our buffer can go at once */
        hid_t fapl = mkv_h5heap_fapl_image(buf, len);
        hid_t f = fapl >= 0 ? H5Fopen("mkv-stdin.h5", H5F_ACC_RDONLY, fapl) : H5I_INVALID_HID;
        if (fapl >= 0)
            H5Pclose(fapl);
        free(buf);
        if (f < 0)
            return mkv_fail(err, MKV_EFORMAT, "standard input is a truncated or damaged HDF5 file");
        *fid = f;
        return MKV_OK;
    }

    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return mkv_fail_errno(err, MKV_EIO, errno, "cannot open '%s'", path);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return mkv_fail_errno(err, MKV_EIO, e, "cannot open '%s'", path);
    }
    close(fd);
    if (S_ISDIR(st.st_mode))
        return mkv_fail_errno(err, MKV_EIO, EISDIR, "cannot open '%s'", path);
    if (st.st_size == 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s' is empty", path);
    if (H5Fis_hdf5(path) <= 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s' is not an HDF5 file", path);
    hid_t fapl = mkv_h5heap_fapl_file(path);
    hid_t f = fapl >= 0 ? H5Fopen(path, H5F_ACC_RDONLY, fapl) : H5I_INVALID_HID;
    if (fapl >= 0)
        H5Pclose(fapl);
    if (f < 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s' is truncated or damaged", path);
    *fid = f;
    return MKV_OK;
}

/* ---------------------------------------------------------------- output */

int mkv_h5_create(const char *path, const char *protect, mkv_h5_out *out, mkv_error *err)
{
    mkv_h5_quiet();
    out->fid = H5I_INVALID_HID;
    int rc = mkv_outfile_open(&out->file, path, protect, MKV_OUTFILE_BINARY, err);
    if (rc)
        return rc;
    const char *seekable = mkv_outfile_seekable_path(&out->file);
    if (seekable) {
        out->fid = H5Fcreate(seekable, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
        if (out->fid < 0) {
            mkv_h5_discard(out);
            return mkv_fail(err, MKV_EIO, "cannot create '%s': HDF5 could not create the file", path);
        }
        return MKV_OK;
    }
    /* standard output, a pipe, a device: build the file in memory and copy
     * its image through when complete */
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0 || H5Pset_fapl_core(fapl, 4 << 20, 0) < 0) {
        if (fapl >= 0)
            H5Pclose(fapl);
        mkv_h5_discard(out);
        return mkv_fail(err, MKV_EIO, "cannot set up an in-memory HDF5 file for '%s'", path);
    }
    out->fid = H5Fcreate("mkv-image.h5", H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    H5Pclose(fapl);
    if (out->fid < 0) {
        mkv_h5_discard(out);
        return mkv_fail(err, MKV_EIO, "cannot create an in-memory HDF5 file for '%s'", path);
    }
    return MKV_OK;
}

int mkv_h5_create_memory(mkv_h5_out *out, mkv_error *err)
{
    mkv_h5_quiet();
    memset(&out->file, 0, sizeof out->file);
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0 || H5Pset_fapl_core(fapl, 4 << 20, 0) < 0) {
        if (fapl >= 0)
            H5Pclose(fapl);
        return mkv_fail(err, MKV_EIO, "cannot set up an in-memory HDF5 file");
    }
    /* HDF5 keys open files by name, in-memory ones too: one name each */
    static atomic_uint serial;
    char name[48];
    snprintf(name, sizeof name, "mkv-memory-%u.h5", atomic_fetch_add(&serial, 1));
    out->fid = H5Fcreate(name, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    H5Pclose(fapl);
    if (out->fid < 0)
        return mkv_fail(err, MKV_EIO, "cannot create an in-memory HDF5 file");
    return MKV_OK;
}

static int write_image(mkv_h5_out *out, mkv_error *err)
{
    if (H5Fflush(out->fid, H5F_SCOPE_GLOBAL) < 0)
        return mkv_fail(err, MKV_EIO, "cannot flush the output image");
    ssize_t size = H5Fget_file_image(out->fid, NULL, 0);
    if (size <= 0)
        return mkv_fail(err, MKV_EIO, "cannot get the output image");
    unsigned char *buf = malloc((size_t)size);
    if (!buf)
        return mkv_fail(err, MKV_ENOMEM, "out of memory for a %zd-byte output image", size);
    int rc = MKV_OK;
    if (H5Fget_file_image(out->fid, buf, (size_t)size) != size)
        rc = mkv_fail(err, MKV_EIO, "cannot get the output image");
    else
        rc = mkv_outfile_write(&out->file, buf, (size_t)size, err);
    free(buf);
    return rc;
}

int mkv_h5_finish(mkv_h5_out *out, mkv_error *err)
{
    int rc = mkv_outfile_seekable_path(&out->file) ? MKV_OK : write_image(out, err);
    herr_t closed = H5Fclose(out->fid);
    out->fid = H5I_INVALID_HID;
    if (!rc && closed < 0)
        rc = out->file.is_stdout
                 ? mkv_fail(err, MKV_EIO, "cannot write standard output: closing the HDF5 file failed")
                 : mkv_fail(err, MKV_EIO, "cannot write '%s': closing the HDF5 file failed", out->file.name);
    if (rc) {
        mkv_h5_discard(out);
        return rc;
    }
    return mkv_outfile_commit(&out->file, err);
}

void mkv_h5_discard(mkv_h5_out *out)
{
    if (out->fid >= 0) {
        H5Fclose(out->fid);
        out->fid = H5I_INVALID_HID;
    }
    mkv_outfile_abort(&out->file);
}

/* ---------------------------------------------------------------- attributes */

static int put_attr(hid_t obj, const char *name, hid_t file_type, hid_t mem_type,
                    const void *value, mkv_error *err)
{
    hid_t space = H5Screate(H5S_SCALAR);
    if (space < 0)
        return mkv_fail(err, MKV_EIO, "cannot write attribute '%s'", name);
    if (H5Aexists(obj, name) > 0)
        H5Adelete(obj, name);
    hid_t a = H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT);
    herr_t w = a >= 0 ? H5Awrite(a, mem_type, value) : -1;
    if (a >= 0)
        H5Aclose(a);
    H5Sclose(space);
    return w < 0 ? mkv_fail(err, MKV_EIO, "cannot write attribute '%s'", name) : MKV_OK;
}

int mkv_h5_attr_put_str(hid_t obj, const char *name, const char *value, mkv_error *err)
{
    /* fixed-length, null-padded UTF-8 of the string's own length: no
     * global heap to damage (h5py reads it as bytes) */
    size_t len = strlen(value);
    hid_t t = H5Tcopy(H5T_C_S1);
    if (t < 0 || H5Tset_size(t, len ? len : 1) < 0 || H5Tset_strpad(t, H5T_STR_NULLPAD) < 0 ||
        H5Tset_cset(t, H5T_CSET_UTF8) < 0) {
        if (t >= 0)
            H5Tclose(t);
        return mkv_fail(err, MKV_EIO, "cannot write attribute '%s'", name);
    }
    int rc = put_attr(obj, name, t, t, len ? value : "", err);
    H5Tclose(t);
    return rc;
}

int mkv_h5_attr_put_int(hid_t obj, const char *name, int64_t value, mkv_error *err)
{
    return put_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value, err);
}

int mkv_h5_attr_put_double(hid_t obj, const char *name, double value, mkv_error *err)
{
    return put_attr(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value, err);
}

int mkv_h5_has_attr(hid_t obj, const char *name) { return H5Aexists(obj, name) > 0; }

int mkv_h5_has_link(hid_t loc, const char *path)
{
    /* H5Lexists needs every intermediate component to exist */
    char buf[512];
    if (strlen(path) >= sizeof buf)
        return 0;
    strcpy(buf, path);
    for (char *p = buf + (buf[0] == '/'); ; p++) {
        if (*p == '/' || *p == '\0') {
            char saved = *p;
            *p = '\0';
            if (H5Lexists(loc, buf, H5P_DEFAULT) <= 0)
                return 0;
            *p = saved;
            if (saved == '\0')
                return 1;
        }
    }
}

static int open_attr(hid_t obj, const char *name, hid_t *a, mkv_error *err)
{
    if (H5Aexists(obj, name) <= 0)
        return mkv_fail(err, MKV_EFORMAT, "missing attribute '%s'", name);
    *a = H5Aopen(obj, name, H5P_DEFAULT);
    if (*a < 0)
        return mkv_fail(err, MKV_EFORMAT, "cannot read attribute '%s'", name);
    hid_t space = H5Aget_space(*a);
    hssize_t n = space >= 0 ? H5Sget_simple_extent_npoints(space) : -1;
    if (space >= 0)
        H5Sclose(space);
    if (n != 1) {
        H5Aclose(*a);
        return mkv_fail(err, MKV_EFORMAT, "attribute '%s' is not a single value", name);
    }
    return MKV_OK;
}

/* A variable-length string attribute (files of older versions, h5py's
 * default), its global heap checked while HDF5 reads it. */
static int get_vlen_str(hid_t obj, hid_t a, hid_t ft, const char *name, char **s, mkv_error *err)
{
    hid_t mt = H5Tcopy(H5T_C_S1);
    if (mt < 0 || H5Tset_size(mt, H5T_VARIABLE) < 0 || H5Tset_cset(mt, H5Tget_cset(ft)) < 0) {
        if (mt >= 0)
            H5Tclose(mt);
        return mkv_fail(err, MKV_EFORMAT, "cannot read attribute '%s'", name);
    }
    char *v = NULL;
    mkv_h5heap_watch_begin(obj);
    herr_t r = H5Aread(a, mt, &v);
    const char *damage = mkv_h5heap_watch_end();
    int rc = MKV_OK;
    if (damage)
        rc = mkv_fail(err, MKV_EFORMAT, "attribute '%s' cannot be read: %s", name, damage);
    else if (r < 0 || !v)
        rc = mkv_fail(err, MKV_EFORMAT, "cannot read attribute '%s'", name);
    else if (!(*s = strdup(v)))
        rc = mkv_fail(err, MKV_ENOMEM, "out of memory reading attribute '%s'", name);
    if (r >= 0) {
        hid_t space = H5Aget_space(a);
        H5Dvlen_reclaim(mt, space, H5P_DEFAULT, &v);
        H5Sclose(space);
    }
    H5Tclose(mt);
    return rc;
}

/* The longest fixed-length string attribute read (every one we know is far
 * shorter): a larger size is a damaged datatype, not a string. */
#define MAX_FIXED_STR (64 << 10)

static int get_fixed_str(hid_t a, hid_t ft, const char *name, char **s, mkv_error *err)
{
    size_t size = H5Tget_size(ft);
    if (size == 0 || size > MAX_FIXED_STR)
        return mkv_fail(err, MKV_EFORMAT, "attribute '%s' is a string of %zu bytes (at most %d are read)",
                        name, size, MAX_FIXED_STR);
    char *v = calloc(size + 1, 1);
    hid_t mt = H5Tcopy(ft);
    int rc = MKV_OK;
    if (!v)
        rc = mkv_fail(err, MKV_ENOMEM, "out of memory reading attribute '%s'", name);
    else if (mt < 0 || H5Aread(a, mt, v) < 0)
        rc = mkv_fail(err, MKV_EFORMAT, "cannot read attribute '%s'", name);
    if (mt >= 0)
        H5Tclose(mt);
    if (rc)
        free(v);
    else
        *s = v;
    return rc;
}

int mkv_h5_attr_get_str(hid_t obj, const char *name, char *buf, size_t bufsize, mkv_error *err)
{
    hid_t a;
    int rc = open_attr(obj, name, &a, err);
    if (rc)
        return rc;
    hid_t ft = H5Aget_type(a);
    char *s = NULL;
    if (ft < 0 || H5Tget_class(ft) != H5T_STRING)
        rc = mkv_fail(err, MKV_EFORMAT, "attribute '%s' is not a string", name);
    else if (H5Tis_variable_str(ft) > 0)
        rc = get_vlen_str(obj, a, ft, name, &s, err);
    else
        rc = get_fixed_str(a, ft, name, &s, err);
    if (!rc && strlen(s) >= bufsize)
        rc = mkv_fail(err, MKV_EFORMAT, "attribute '%s' is longer than %zu bytes", name, bufsize - 1);
    else if (!rc)
        memcpy(buf, s, strlen(s) + 1);
    free(s);
    if (ft >= 0)
        H5Tclose(ft);
    H5Aclose(a);
    return rc;
}

static int get_number(hid_t obj, const char *name, hid_t mem_type, void *value, mkv_error *err)
{
    hid_t a;
    int rc = open_attr(obj, name, &a, err);
    if (rc)
        return rc;
    hid_t ft = H5Aget_type(a);
    H5T_class_t cls = ft >= 0 ? H5Tget_class(ft) : H5T_NO_CLASS;
    if (cls != H5T_INTEGER && cls != H5T_FLOAT)
        rc = mkv_fail(err, MKV_EFORMAT, "attribute '%s' is not a number", name);
    else if (mem_type == H5T_NATIVE_INT64 && cls == H5T_FLOAT)
        rc = mkv_fail(err, MKV_EFORMAT, "attribute '%s' is not an integer", name);
    else if (H5Aread(a, mem_type, value) < 0)
        rc = mkv_fail(err, MKV_EFORMAT, "cannot read attribute '%s'", name);
    if (ft >= 0)
        H5Tclose(ft);
    H5Aclose(a);
    return rc;
}

int mkv_h5_attr_get_int(hid_t obj, const char *name, int64_t *value, mkv_error *err)
{
    return get_number(obj, name, H5T_NATIVE_INT64, value, err);
}

int mkv_h5_attr_get_double(hid_t obj, const char *name, double *value, mkv_error *err)
{
    return get_number(obj, name, H5T_NATIVE_DOUBLE, value, err);
}

/* The largest chunk read, in bytes: far above any this project or h5py
 * writes (HDF5's own limit is 4 GiB). */
#define MAX_CHUNK_BYTES ((double)(1 << 30))

/* A chunked layout whose chunk shape exceeds a fixed dimension of the
 * dataset made HDF5 1.10.8 copy past its buffers in H5D__select_read (a
 * SEGV found by tests/fuzz/fuzz_dump). */
static int layout_ok(hid_t ds)
{
    hid_t dcpl = H5Dget_create_plist(ds);
    if (dcpl < 0)
        return 0;
    int ok = 1;
    if (H5Pget_layout(dcpl) == H5D_CHUNKED) {
        hsize_t chunk[H5S_MAX_RANK], dims[H5S_MAX_RANK], maxdims[H5S_MAX_RANK];
        hid_t space = H5Dget_space(ds), type = H5Dget_type(ds);
        int rank = space >= 0 ? H5Sget_simple_extent_dims(space, dims, maxdims) : -1;
        int crank = H5Pget_chunk(dcpl, H5S_MAX_RANK, chunk);
        double bytes = type >= 0 ? (double)H5Tget_size(type) : 0;
        ok = rank >= 0 && crank == rank && bytes > 0;
        for (int i = 0; ok && i < rank; i++) {
            ok = chunk[i] > 0 && (maxdims[i] == H5S_UNLIMITED || chunk[i] <= (maxdims[i] > 0 ? maxdims[i] : 1));
            bytes *= (double)chunk[i];
        }
        ok = ok && bytes <= MAX_CHUNK_BYTES;
        if (type >= 0)
            H5Tclose(type);
        if (space >= 0)
            H5Sclose(space);
    }
    H5Pclose(dcpl);
    return ok;
}

herr_t mkv_h5_dread(hid_t ds, hid_t mem_type, hid_t mspace, hid_t fspace, void *buf)
{
    return layout_ok(ds) ? H5Dread(ds, mem_type, mspace, fspace, H5P_DEFAULT, buf) : -1;
}
