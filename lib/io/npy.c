/* .npy reader (see npy.h). */
#include "io/npy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fileio.h"
#include "core/half.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "npy.c assumes a little-endian host"
#endif

#define CONVERT_CHUNK 4096
struct mkv_npy {
    char *path;
    int fd;
    mkv_npy_info info;
};

static const struct {
    const char *descr;
    size_t size;
    int is_float;
} known_descr[] = {
    {"<f2", 2, 1}, {"<f4", 4, 1}, {"<f8", 8, 1}, {"<i4", 4, 0}, {"<i8", 8, 0},
};

/* ---------------------------------------------------------------- header dict */

typedef struct {
    const char *s, *p, *end;
    const char *path;
    mkv_error *err;
} hdr_parser;

static int hdr_fail(hdr_parser *h, const char *what)
{
    return mkv_fail(h->err, MKV_EFORMAT, "'%s': npy header: %s at header byte %zu", h->path, what,
                    (size_t)(h->p - h->s));
}

static void hdr_ws(hdr_parser *h)
{
    while (h->p < h->end && (*h->p == ' ' || *h->p == '\t' || *h->p == '\n' || *h->p == '\r'))
        h->p++;
}

static int hdr_expect(hdr_parser *h, char c, const char *what)
{
    hdr_ws(h);
    if (h->p >= h->end || *h->p != c)
        return hdr_fail(h, what);
    h->p++;
    return MKV_OK;
}

/* A Python string literal without escapes, into buf. */
static int hdr_string(hdr_parser *h, char *buf, size_t bufsize)
{
    hdr_ws(h);
    if (h->p >= h->end || (*h->p != '\'' && *h->p != '"'))
        return hdr_fail(h, "expected a quoted string");
    char q = *h->p++;
    size_t n = 0;
    while (h->p < h->end && *h->p != q) {
        unsigned char c = (unsigned char)*h->p;
        if (c == '\\' || c < 0x20 || c >= 0x7f)
            return hdr_fail(h, "unsupported character in string");
        if (n + 1 >= bufsize)
            return hdr_fail(h, "string too long");
        buf[n++] = (char)c;
        h->p++;
    }
    if (h->p >= h->end)
        return hdr_fail(h, "unterminated string");
    h->p++;
    buf[n] = '\0';
    return MKV_OK;
}

static int hdr_word(hdr_parser *h, const char *w)
{
    size_t n = strlen(w);
    if ((size_t)(h->end - h->p) >= n && memcmp(h->p, w, n) == 0) {
        h->p += n;
        return 1;
    }
    return 0;
}

static int hdr_bool(hdr_parser *h, int *out)
{
    hdr_ws(h);
    if (hdr_word(h, "True"))
        *out = 1;
    else if (hdr_word(h, "False"))
        *out = 0;
    else
        return hdr_fail(h, "expected True or False");
    return MKV_OK;
}

static int hdr_shape(hdr_parser *h, mkv_npy_info *info)
{
    int rc = hdr_expect(h, '(', "expected '(' starting the shape tuple");
    if (rc)
        return rc;
    int n = 0, trailing_comma = 0;
    for (;;) {
        hdr_ws(h);
        if (h->p < h->end && *h->p == ')') {
            h->p++;
            break;
        }
        if (n > 0 && !trailing_comma)
            return hdr_fail(h, "expected ',' or ')' in the shape tuple");
        if (h->p >= h->end || *h->p < '0' || *h->p > '9')
            return hdr_fail(h, "expected a non-negative integer in the shape tuple");
        if (n == MKV_NPY_MAX_DIMS)
            return hdr_fail(h, "too many dimensions");
        int64_t v = 0;
        while (h->p < h->end && *h->p >= '0' && *h->p <= '9') {
            int d = *h->p - '0';
            if (v > (INT64_MAX - d) / 10)
                return hdr_fail(h, "dimension too large");
            v = v * 10 + d;
            h->p++;
        }
        if (h->p < h->end && *h->p == 'L') /* written by Python 2 */
            h->p++;
        info->shape[n++] = v;
        hdr_ws(h);
        trailing_comma = 0;
        if (h->p < h->end && *h->p == ',') {
            h->p++;
            trailing_comma = 1;
        }
    }
    if (n == 1 && !trailing_comma)
        return hdr_fail(h, "a one-dimensional shape needs a trailing comma, as in (5,)");
    info->ndim = n;
    return MKV_OK;
}

static int parse_header(const char *path, const char *text, size_t len, mkv_npy_info *info,
                        mkv_error *err)
{
    hdr_parser h = {.s = text, .p = text, .end = text + len, .path = path, .err = err};
    int have_descr = 0, have_order = 0, have_shape = 0, fortran = 0;
    char descr[32];
    int rc = hdr_expect(&h, '{', "expected '{'");
    for (;;) {
        if (rc)
            return rc;
        hdr_ws(&h);
        if (h.p < h.end && *h.p == '}') {
            h.p++;
            break;
        }
        char key[32];
        if ((rc = hdr_string(&h, key, sizeof key)) || (rc = hdr_expect(&h, ':', "expected ':'")))
            return rc;
        if (strcmp(key, "descr") == 0 && !have_descr) {
            have_descr = 1;
            const char *at = h.p;
            hdr_ws(&h);
            if (h.p < h.end && *h.p == '[')
                return mkv_fail(err, MKV_EUNSUP, "'%s': structured arrays are not supported", path);
            h.p = at;
            rc = hdr_string(&h, descr, sizeof descr);
        } else if (strcmp(key, "fortran_order") == 0 && !have_order) {
            have_order = 1;
            rc = hdr_bool(&h, &fortran);
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            have_shape = 1;
            rc = hdr_shape(&h, info);
        } else {
            return mkv_fail(err, MKV_EFORMAT, "'%s': npy header: unexpected or repeated key '%s'",
                            path, key);
        }
        if (rc)
            return rc;
        hdr_ws(&h);
        if (h.p < h.end && *h.p == ',')
            h.p++;
        else if (h.p >= h.end || *h.p != '}')
            rc = hdr_fail(&h, "expected ',' or '}'");
    }
    hdr_ws(&h);
    if (h.p != h.end)
        return hdr_fail(&h, "unexpected text after the dictionary");
    if (!have_descr || !have_order || !have_shape)
        return mkv_fail(err, MKV_EFORMAT, "'%s': npy header lacks '%s'", path,
                        !have_descr ? "descr" : !have_order ? "fortran_order" : "shape");
    if (fortran)
        return mkv_fail(err, MKV_EUNSUP,
                        "'%s': Fortran-order arrays are not supported (save with C order)", path);
    size_t i;
    for (i = 0; i < sizeof known_descr / sizeof known_descr[0]; i++)
        if (strcmp(descr, known_descr[i].descr) == 0)
            break;
    if (i == sizeof known_descr / sizeof known_descr[0])
        return mkv_fail(err, MKV_EUNSUP,
                        "'%s': unsupported dtype '%s' (supported: <f2 <f4 <f8 <i4 <i8)", path, descr);
    strcpy(info->descr, known_descr[i].descr);
    info->elem_size = known_descr[i].size;
    info->is_float = known_descr[i].is_float;
    return MKV_OK;
}

/* ---------------------------------------------------------------- open/read */

void mkv_npy_close(mkv_npy *f)
{
    if (f == NULL)
        return;
    if (f->fd >= 0)
        close(f->fd);
    free(f->path);
    free(f);
}

const mkv_npy_info *mkv_npy_info_of(const mkv_npy *f) { return &f->info; }
const char *mkv_npy_path(const mkv_npy *f) { return f->path; }

int mkv_npy_open(const char *path, mkv_npy **out, mkv_error *err)
{
    *out = NULL;
    mkv_npy *f = calloc(1, sizeof *f);
    if (f == NULL || (f->path = strdup(path)) == NULL) {
        free(f);
        return mkv_fail(err, MKV_ENOMEM, "out of memory opening '%s'", path);
    }
    int rc = MKV_OK, e;
    char *header = NULL;
    mkv_npy_info *info = &f->info;
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
    unsigned char pre[12];
    if (size < 10 || (e = mkv_pread_full(f->fd, pre, size < 12 ? 10 : 12, 0)) != 0 ||
        memcmp(pre, "\x93NUMPY", 6) != 0) {
        rc = mkv_fail(err, MKV_EFORMAT, "'%s': not a .npy file (bad magic)", path);
        goto done;
    }
    int major = pre[6], minor = pre[7];
    if (major < 1 || major > 3 || minor != 0) {
        rc = mkv_fail(err, MKV_EUNSUP, "'%s': .npy format version %d.%d is not supported (1.0-3.0 are)",
                      path, major, minor);
        goto done;
    }
    uint64_t hlen, hstart;
    if (major == 1) {
        hlen = (uint64_t)pre[8] | (uint64_t)pre[9] << 8;
        hstart = 10;
    } else {
        if (size < 12) {
            rc = mkv_fail(err, MKV_EFORMAT, "'%s': truncated .npy header", path);
            goto done;
        }
        hlen = (uint64_t)pre[8] | (uint64_t)pre[9] << 8 | (uint64_t)pre[10] << 16 | (uint64_t)pre[11] << 24;
        hstart = 12;
    }
    if (hlen > MKV_NPY_MAX_HEADER) {
        rc = mkv_fail(err, MKV_EFORMAT, "'%s': npy header length %llu is beyond the %u-byte limit",
                      path, (unsigned long long)hlen, MKV_NPY_MAX_HEADER);
        goto done;
    }
    if (hlen > size - hstart) {
        rc = mkv_fail(err, MKV_EFORMAT, "'%s': npy header length %llu exceeds the file size (%llu bytes)",
                      path, (unsigned long long)hlen, (unsigned long long)size);
        goto done;
    }
    header = malloc(hlen ? hlen : 1);
    if (header == NULL) {
        rc = mkv_fail(err, MKV_ENOMEM, "out of memory opening '%s'", path);
        goto done;
    }
    if ((e = mkv_pread_full(f->fd, header, hlen, hstart)) != 0) {
        rc = e == MKV_PREAD_EOF ? mkv_fail(err, MKV_EIO, "cannot read '%s': file shrank", path)
                            : mkv_fail_errno(err, MKV_EIO, e, "cannot read '%s'", path);
        goto done;
    }
    if ((rc = parse_header(path, header, hlen, info, err)) != MKV_OK)
        goto done;
    info->version = major;
    info->data_offset = hstart + hlen;
    uint64_t numel = 1;
    int overflow = 0;
    for (int d = 0; d < info->ndim; d++) {
        uint64_t dim = (uint64_t)info->shape[d];
        if (dim != 0 && numel > UINT64_MAX / dim)
            overflow = 1;
        numel *= dim;
    }
    for (int d = 0; d < info->ndim; d++)
        if (info->shape[d] == 0) { /* empty whatever the other dimensions are */
            numel = 0;
            overflow = 0;
        }
    if (overflow || numel > (UINT64_MAX - info->data_offset) / info->elem_size) {
        rc = mkv_fail(err, MKV_EFORMAT, "'%s': shape too large (byte count overflows)", path);
        goto done;
    }
    info->numel = numel;
    uint64_t want = info->data_offset + numel * info->elem_size;
    if (size < want)
        rc = mkv_fail(err, MKV_EFORMAT, "'%s': truncated: the header promises %llu data bytes, %llu present",
                      path, (unsigned long long)(numel * info->elem_size),
                      (unsigned long long)(size - info->data_offset));
    else if (size > want)
        rc = mkv_fail(err, MKV_EFORMAT, "'%s': %llu bytes after the data the header describes", path,
                      (unsigned long long)(size - want));
done:
    free(header);
    if (rc != MKV_OK) {
        mkv_npy_close(f);
        return rc;
    }
    *out = f;
    return MKV_OK;
}

int mkv_npy_read_f32(mkv_npy *f, uint64_t first, size_t count, float *out, mkv_error *err)
{
    const mkv_npy_info *info = &f->info;
    if (first > info->numel || count > info->numel - first)
        return mkv_fail(err, MKV_EUSAGE, "'%s': elements [%llu, %llu) requested of %llu", f->path,
                        (unsigned long long)first, (unsigned long long)first + count,
                        (unsigned long long)info->numel);
    union {
        uint16_t h[CONVERT_CHUNK];
        float f[CONVERT_CHUNK];
        double d[CONVERT_CHUNK];
        int32_t i4[CONVERT_CHUNK];
        int64_t i8[CONVERT_CHUNK];
    } buf;
    for (size_t done = 0; done < count;) {
        size_t n = count - done < CONVERT_CHUNK ? count - done : CONVERT_CHUNK;
        /* float32 goes straight into the caller's buffer */
        void *dst = strcmp(info->descr, "<f4") == 0 ? (void *)(out + done) : (void *)&buf;
        int e = mkv_pread_full(f->fd, dst, n * info->elem_size,
                           info->data_offset + (first + done) * info->elem_size);
        if (e == MKV_PREAD_EOF)
            return mkv_fail(err, MKV_EIO, "cannot read '%s': file truncated", f->path);
        if (e)
            return mkv_fail_errno(err, MKV_EIO, e, "cannot read '%s'", f->path);
        float *o = out + done;
        switch (info->is_float ? (int)info->elem_size : -(int)info->elem_size) {
        case 2: mkv_f16_to_f32_n(buf.h, o, n); break;
        case 4: break;
        case 8: for (size_t i = 0; i < n; i++) o[i] = (float)buf.d[i]; break;
        case -4: for (size_t i = 0; i < n; i++) o[i] = (float)buf.i4[i]; break;
        default: for (size_t i = 0; i < n; i++) o[i] = (float)buf.i8[i]; break;
        }
        done += n;
    }
    return MKV_OK;
}
