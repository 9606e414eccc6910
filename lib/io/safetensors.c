/* .safetensors reader (see safetensors.h). */
#include "io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fileio.h"
#include "core/half.h"

/* Tensor data are little-endian and copied into host integers and floats
 * as they are. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

/* Elements converted per pread in the converting readers. */
#define CONVERT_CHUNK 4096

struct mkv_st_file {
    char *path;
    int fd;
    uint64_t data_start, data_size;
    mkv_json_doc *doc;
    const mkv_json *root;
    const mkv_json *metadata;
    mkv_st_tensor *tensors;
    size_t n_tensors;
    size_t *tensor_of_member; /* header member index -> tensor index (SIZE_MAX: metadata) */
};

static const struct {
    const char *name;
    size_t size;
} dtype_info[] = {
    [MKV_ST_BOOL] = {"BOOL", 1},   [MKV_ST_U8] = {"U8", 1},     [MKV_ST_I8] = {"I8", 1},
    [MKV_ST_F8_E5M2] = {"F8_E5M2", 1}, [MKV_ST_F8_E4M3] = {"F8_E4M3", 1},
    [MKV_ST_I16] = {"I16", 2},     [MKV_ST_U16] = {"U16", 2},   [MKV_ST_F16] = {"F16", 2},
    [MKV_ST_BF16] = {"BF16", 2},   [MKV_ST_I32] = {"I32", 4},   [MKV_ST_U32] = {"U32", 4},
    [MKV_ST_F32] = {"F32", 4},     [MKV_ST_F64] = {"F64", 8},   [MKV_ST_I64] = {"I64", 8},
    [MKV_ST_U64] = {"U64", 8},
};
#define N_DTYPES (sizeof dtype_info / sizeof dtype_info[0])

const char *mkv_st_dtype_name(mkv_st_dtype t)
{
    return (size_t)t < N_DTYPES ? dtype_info[t].name : "?";
}

size_t mkv_st_dtype_size(mkv_st_dtype t)
{
    return (size_t)t < N_DTYPES ? dtype_info[t].size : 0;
}

static int parse_dtype(const char *s, mkv_st_dtype *t)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if (strcmp(s, dtype_info[i].name) == 0) {
            *t = (mkv_st_dtype)i;
            return 0;
        }
    return -1;
}

void mkv_st_close(mkv_st_file *f)
{
    if (f == NULL)
        return;
    if (f->fd >= 0)
        close(f->fd);
    mkv_json_free(f->doc);
    free(f->tensors);
    free(f->tensor_of_member);
    free(f->path);
    free(f);
}

const char *mkv_st_path(const mkv_st_file *f) { return f->path; }
size_t mkv_st_count(const mkv_st_file *f) { return f->n_tensors; }
const mkv_json *mkv_st_metadata(const mkv_st_file *f) { return f->metadata; }

const mkv_st_tensor *mkv_st_tensor_at(const mkv_st_file *f, size_t i)
{
    return i < f->n_tensors ? &f->tensors[i] : NULL;
}

const mkv_st_tensor *mkv_st_find(const mkv_st_file *f, const char *name)
{
    size_t member;
    if (mkv_json_find(f->root, name, strlen(name), &member) != 0)
        return NULL;
    size_t t = f->tensor_of_member[member];
    return t == SIZE_MAX ? NULL : &f->tensors[t];
}

uint64_t mkv_st_row_elems(const mkv_st_tensor *t)
{
    uint64_t n = 1; /* cannot overflow: mkv_st_open checked the product of the non-zero dimensions */
    for (int d = 1; d < t->ndim; d++)
        n *= (uint64_t)t->shape[d];
    return n;
}

/* A non-negative JSON integer. */
static int json_uint(const mkv_json *v, uint64_t *out)
{
    int64_t i;
    if (mkv_json_int64(v, &i) != 0 || i < 0)
        return -1;
    *out = (uint64_t)i;
    return 0;
}

static int check_metadata(mkv_st_file *f, const mkv_json *meta, mkv_error *err)
{
    if (mkv_json_type_of(meta) != MKV_JSON_OBJECT)
        return mkv_fail(err, MKV_EFORMAT, "'%s': __metadata__ is a JSON %s, not an object",
                        f->path, mkv_json_type_name(mkv_json_type_of(meta)));
    for (size_t i = 0; i < mkv_json_len(meta); i++)
        if (mkv_json_type_of(mkv_json_value_at(meta, i)) != MKV_JSON_STRING)
            return mkv_fail(err, MKV_EFORMAT, "'%s': __metadata__ entry '%s' is not a string",
                            f->path, mkv_json_key_at(meta, i, NULL));
    f->metadata = meta;
    return MKV_OK;
}

static int parse_tensor(mkv_st_file *f, const char *name, const mkv_json *e, mkv_st_tensor *t,
                        mkv_error *err)
{
    const char *path = f->path;
    if (mkv_json_type_of(e) != MKV_JSON_OBJECT)
        return mkv_fail(err, MKV_EFORMAT, "'%s': tensor '%s': entry is a JSON %s, not an object",
                        path, name, mkv_json_type_name(mkv_json_type_of(e)));
    memset(t, 0, sizeof *t);
    t->name = name;

    const char *dtype = mkv_json_str(mkv_json_get(e, "dtype"), NULL);
    if (dtype == NULL)
        return mkv_fail(err, MKV_EFORMAT, "'%s': tensor '%s': missing or non-string \"dtype\"", path, name);
    if (parse_dtype(dtype, &t->dtype) != 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s': tensor '%s': unknown dtype \"%s\"", path, name, dtype);

    const mkv_json *shape = mkv_json_get(e, "shape");
    if (mkv_json_type_of(shape) != MKV_JSON_ARRAY)
        return mkv_fail(err, MKV_EFORMAT, "'%s': tensor '%s': missing or non-array \"shape\"", path, name);
    if (mkv_json_len(shape) > MKV_ST_MAX_DIMS)
        return mkv_fail(err, MKV_EFORMAT, "'%s': tensor '%s': %zu dimensions (at most %d supported)",
                        path, name, mkv_json_len(shape), MKV_ST_MAX_DIMS);
    t->ndim = (int)mkv_json_len(shape);
    uint64_t numel = 1;
    int overflow = 0, has_zero = 0;
    for (int d = 0; d < t->ndim; d++) {
        uint64_t dim;
        if (json_uint(mkv_json_at(shape, (size_t)d), &dim) != 0)
            return mkv_fail(err, MKV_EFORMAT,
                            "'%s': tensor '%s': shape[%d] is not a non-negative integer", path, name, d);
        t->shape[d] = (int64_t)dim;
        /* the product of the non-zero dimensions must fit too, so that
         * any sub-product (mkv_st_row_elems) does */
        if (dim == 0)
            has_zero = 1;
        else if (numel > UINT64_MAX / dim)
            overflow = 1;
        else
            numel *= dim;
    }
    if (has_zero)
        numel = 0;
    if (overflow)
        return mkv_fail(err, MKV_EFORMAT, "'%s': tensor '%s': shape too large (element count overflows)",
                        path, name);
    t->numel = numel;
    size_t esize = mkv_st_dtype_size(t->dtype);
    if (numel > UINT64_MAX / esize)
        return mkv_fail(err, MKV_EFORMAT, "'%s': tensor '%s': shape too large (byte count overflows)",
                        path, name);
    uint64_t need = numel * esize;

    const mkv_json *offs = mkv_json_get(e, "data_offsets");
    uint64_t begin, end;
    if (mkv_json_type_of(offs) != MKV_JSON_ARRAY || mkv_json_len(offs) != 2 ||
        json_uint(mkv_json_at(offs, 0), &begin) != 0 || json_uint(mkv_json_at(offs, 1), &end) != 0)
        return mkv_fail(err, MKV_EFORMAT,
                        "'%s': tensor '%s': \"data_offsets\" must be two non-negative integers",
                        path, name);
    if (begin > end)
        return mkv_fail(err, MKV_EFORMAT, "'%s': tensor '%s': data_offsets [%llu, %llu] run backwards",
                        path, name, (unsigned long long)begin, (unsigned long long)end);
    if (end > f->data_size)
        return mkv_fail(err, MKV_EFORMAT,
                        "'%s': tensor '%s': data_offsets [%llu, %llu] lie outside the data area "
                        "(%llu bytes)", path, name, (unsigned long long)begin, (unsigned long long)end,
                        (unsigned long long)f->data_size);
    if (end - begin != need)
        return mkv_fail(err, MKV_EFORMAT,
                        "'%s': tensor '%s': data_offsets span %llu bytes but %s of %llu elements "
                        "needs %llu", path, name, (unsigned long long)(end - begin), dtype,
                        (unsigned long long)numel, (unsigned long long)need);
    t->offset = f->data_start + begin;
    t->nbytes = need;
    return MKV_OK;
}

static int cmp_by_offset(const void *a, const void *b)
{
    const mkv_st_tensor *x = *(const mkv_st_tensor *const *)a, *y = *(const mkv_st_tensor *const *)b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

static int check_overlaps(mkv_st_file *f, mkv_error *err)
{
    if (f->n_tensors < 2)
        return MKV_OK;
    const mkv_st_tensor **by_off = malloc(f->n_tensors * sizeof *by_off);
    if (by_off == NULL)
        return mkv_fail(err, MKV_ENOMEM, "'%s': out of memory", f->path);
    for (size_t i = 0; i < f->n_tensors; i++)
        by_off[i] = &f->tensors[i];
    qsort(by_off, f->n_tensors, sizeof *by_off, cmp_by_offset);
    const mkv_st_tensor *prev = NULL; /* the non-empty tensor ending last so far */
    int rc = MKV_OK;
    for (size_t i = 0; i < f->n_tensors && rc == MKV_OK; i++) {
        const mkv_st_tensor *t = by_off[i];
        if (t->nbytes == 0)
            continue; /* empty tensors occupy no bytes */
        if (prev != NULL && t->offset < prev->offset + prev->nbytes)
            rc = mkv_fail(err, MKV_EFORMAT, "'%s': tensors '%s' and '%s' overlap in the data area",
                          f->path, prev->name, t->name);
        if (prev == NULL || t->offset + t->nbytes > prev->offset + prev->nbytes)
            prev = t;
    }
    free(by_off);
    return rc;
}

int mkv_st_open(const char *path, mkv_st_file **out, mkv_error *err)
{
    *out = NULL;
    mkv_st_file *f = calloc(1, sizeof *f);
    if (f == NULL || (f->path = strdup(path)) == NULL) {
        free(f);
        return mkv_fail(err, MKV_ENOMEM, "out of memory opening '%s'", path);
    }
    int rc = MKV_OK;
    char *header = NULL;
    f->fd = open(path, O_RDONLY);
    if (f->fd < 0) {
        rc = mkv_fail_errno(err, MKV_EIO, errno, "cannot open '%s'", path);
        goto done;
    }
    struct stat st;
    if (fstat(f->fd, &st) != 0) {
        rc = mkv_fail_errno(err, MKV_EIO, errno, "cannot read '%s'", path);
        goto done;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = mkv_fail(err, MKV_EIO, "cannot read '%s': not a regular file", path);
        goto done;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size < 8) {
        rc = mkv_fail(err, MKV_EFORMAT, "'%s': %s (%llu bytes): not a safetensors file", path,
                      size == 0 ? "empty file" : "too short", (unsigned long long)size);
        goto done;
    }
    unsigned char lenbuf[8];
    int e = mkv_pread_full(f->fd, lenbuf, 8, 0);
    if (e) {
        rc = e == MKV_PREAD_EOF ? mkv_fail(err, MKV_EIO, "cannot read '%s': file shrank", path)
                            : mkv_fail_errno(err, MKV_EIO, e, "cannot read '%s'", path);
        goto done;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | lenbuf[i];
    if (hlen > MKV_ST_MAX_HEADER) {
        rc = mkv_fail(err, MKV_EFORMAT,
                      "'%s': header length %llu is beyond the %u-byte limit: not a safetensors file?",
                      path, (unsigned long long)hlen, MKV_ST_MAX_HEADER);
        goto done;
    }
    if (hlen > size - 8) {
        rc = mkv_fail(err, MKV_EFORMAT,
                      "'%s': header length %llu exceeds the file size (%llu bytes): truncated file?",
                      path, (unsigned long long)hlen, (unsigned long long)size);
        goto done;
    }
    f->data_start = 8 + hlen;
    f->data_size = size - f->data_start;
    header = malloc(hlen ? hlen : 1);
    if (header == NULL) {
        rc = mkv_fail(err, MKV_ENOMEM, "'%s': out of memory for a %llu-byte header", path,
                      (unsigned long long)hlen);
        goto done;
    }
    if ((e = mkv_pread_full(f->fd, header, hlen, 8)) != 0) {
        rc = e == MKV_PREAD_EOF ? mkv_fail(err, MKV_EIO, "cannot read '%s': file shrank", path)
                            : mkv_fail_errno(err, MKV_EIO, e, "cannot read '%s'", path);
        goto done;
    }
    /* Tensor entries nest three deep; metadata is flat. */
    mkv_json_limits lim = {.max_bytes = MKV_ST_MAX_HEADER, .max_depth = 16};
    if ((rc = mkv_json_parse(header, hlen, &lim, &f->doc, err)) != MKV_OK) {
        mkv_error_prefix(err, "'%s': header", path);
        goto done;
    }
    f->root = mkv_json_root(f->doc);
    if (mkv_json_type_of(f->root) != MKV_JSON_OBJECT) {
        rc = mkv_fail(err, MKV_EFORMAT, "'%s': header is a JSON %s, not an object", path,
                      mkv_json_type_name(mkv_json_type_of(f->root)));
        goto done;
    }
    size_t n = mkv_json_len(f->root);
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    f->tensor_of_member = calloc(n ? n : 1, sizeof *f->tensor_of_member);
    if (f->tensors == NULL || f->tensor_of_member == NULL) {
        rc = mkv_fail(err, MKV_ENOMEM, "'%s': out of memory for %zu tensors", path, n);
        goto done;
    }
    for (size_t i = 0; i < n && rc == MKV_OK; i++) {
        size_t name_len;
        const char *name = mkv_json_key_at(f->root, i, &name_len);
        const mkv_json *entry = mkv_json_value_at(f->root, i);
        if (strlen(name) != name_len) {
            /* names are looked up as C strings: "a\u0000b" would be "a" */
            rc = mkv_fail(err, MKV_EFORMAT, "'%s': tensor name '%s\\u0000...' holds a NUL character", path, name);
        } else if (strcmp(name, "__metadata__") == 0) {
            f->tensor_of_member[i] = SIZE_MAX;
            rc = check_metadata(f, entry, err);
        } else {
            f->tensor_of_member[i] = f->n_tensors;
            rc = parse_tensor(f, name, entry, &f->tensors[f->n_tensors++], err);
        }
    }
    if (rc == MKV_OK)
        rc = check_overlaps(f, err);
done:
    free(header);
    if (rc != MKV_OK) {
        mkv_st_close(f);
        return rc;
    }
    *out = f;
    return MKV_OK;
}

static int check_range(mkv_st_file *f, const mkv_st_tensor *t, uint64_t first, size_t count,
                       mkv_error *err)
{
    if (first > t->numel || count > t->numel - first)
        return mkv_fail(err, MKV_EUSAGE,
                        "'%s': tensor '%s': elements [%llu, %llu) requested of %llu", f->path, t->name,
                        (unsigned long long)first, (unsigned long long)first + count,
                        (unsigned long long)t->numel);
    return MKV_OK;
}

static int read_bytes(mkv_st_file *f, const mkv_st_tensor *t, uint64_t first, size_t count, void *out,
                      mkv_error *err)
{
    size_t esize = mkv_st_dtype_size(t->dtype);
    int e = mkv_pread_full(f->fd, out, count * esize, t->offset + first * esize);
    if (e == MKV_PREAD_EOF)
        return mkv_fail(err, MKV_EIO, "cannot read tensor '%s' from '%s': file truncated", t->name, f->path);
    if (e)
        return mkv_fail_errno(err, MKV_EIO, e, "cannot read tensor '%s' from '%s'", t->name, f->path);
    return MKV_OK;
}

int mkv_st_read_raw(mkv_st_file *f, const mkv_st_tensor *t, uint64_t first, size_t count, void *out,
                    mkv_error *err)
{
    int rc = check_range(f, t, first, count, err);
    return rc ? rc : read_bytes(f, t, first, count, out, err);
}

int mkv_st_read_f32(mkv_st_file *f, const mkv_st_tensor *t, uint64_t first, size_t count, float *out,
                    mkv_error *err)
{
    int rc = check_range(f, t, first, count, err);
    if (rc)
        return rc;
    switch (t->dtype) {
    case MKV_ST_F32:
        return read_bytes(f, t, first, count, out, err);
    case MKV_ST_F16:
    case MKV_ST_BF16:
    case MKV_ST_F64:
        break;
    default:
        return mkv_fail(err, MKV_EUNSUP, "'%s': tensor '%s' has dtype %s, which cannot be read as float32",
                        f->path, t->name, mkv_st_dtype_name(t->dtype));
    }
    union {
        uint16_t h[CONVERT_CHUNK];
        double d[CONVERT_CHUNK];
    } buf;
    for (size_t done = 0; done < count;) {
        size_t n = count - done < CONVERT_CHUNK ? count - done : CONVERT_CHUNK;
        if ((rc = read_bytes(f, t, first + done, n, &buf, err)) != MKV_OK)
            return rc;
        if (t->dtype == MKV_ST_F16)
            mkv_f16_to_f32_n(buf.h, out + done, n);
        else if (t->dtype == MKV_ST_BF16)
            mkv_bf16_to_f32_n(buf.h, out + done, n);
        else
            for (size_t i = 0; i < n; i++)
                out[done + i] = (float)buf.d[i];
        done += n;
    }
    return MKV_OK;
}

int mkv_st_read_i32(mkv_st_file *f, const mkv_st_tensor *t, uint64_t first, size_t count, int32_t *out,
                    mkv_error *err)
{
    int rc = check_range(f, t, first, count, err);
    if (rc)
        return rc;
    switch (t->dtype) {
    case MKV_ST_I32:
        return read_bytes(f, t, first, count, out, err);
    case MKV_ST_BOOL: case MKV_ST_U8: case MKV_ST_I8: case MKV_ST_I16: case MKV_ST_U16:
    case MKV_ST_U32: case MKV_ST_I64: case MKV_ST_U64:
        break;
    default:
        return mkv_fail(err, MKV_EUNSUP, "'%s': tensor '%s' has dtype %s, which cannot be read as int32",
                        f->path, t->name, mkv_st_dtype_name(t->dtype));
    }
    union {
        uint8_t u8[CONVERT_CHUNK];
        int8_t i8[CONVERT_CHUNK];
        int16_t i16[CONVERT_CHUNK];
        uint16_t u16[CONVERT_CHUNK];
        uint32_t u32[CONVERT_CHUNK];
        int64_t i64[CONVERT_CHUNK];
        uint64_t u64[CONVERT_CHUNK];
    } buf;
    for (size_t done = 0; done < count;) {
        size_t n = count - done < CONVERT_CHUNK ? count - done : CONVERT_CHUNK;
        if ((rc = read_bytes(f, t, first + done, n, &buf, err)) != MKV_OK)
            return rc;
        for (size_t i = 0; i < n; i++) {
            int in_range = 1;
            int64_t v = 0;
            switch (t->dtype) {
            case MKV_ST_BOOL:
            case MKV_ST_U8: v = buf.u8[i]; break;
            case MKV_ST_I8: v = buf.i8[i]; break;
            case MKV_ST_I16: v = buf.i16[i]; break;
            case MKV_ST_U16: v = buf.u16[i]; break;
            case MKV_ST_U32: v = buf.u32[i]; break;
            case MKV_ST_I64: v = buf.i64[i]; break;
            default: /* U64 */
                in_range = buf.u64[i] <= INT32_MAX;
                v = in_range ? (int64_t)buf.u64[i] : 0;
                break;
            }
            if (!in_range || v < INT32_MIN || v > INT32_MAX)
                return mkv_fail(err, MKV_EFORMAT,
                                "'%s': tensor '%s': element %llu does not fit in int32", f->path, t->name,
                                (unsigned long long)(first + done + i));
            out[done + i] = (int32_t)v;
        }
        done += n;
    }
    return MKV_OK;
}
