/* Full validation of a dump: every attribute, shape, type, index range and
 * value, reporting each problem found rather than stopping at the first. */
#include "config.h"
#include "io/dump.h"
#include "io/dump_priv.h"

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/h5file.h"

typedef struct {
    mkv_problem_fn report;
    void *ctx;
    int count;
} problems;

static void problem(problems *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void problem(problems *p, const char *fmt, ...)
{
    char line[MKV_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    p->report(p->ctx, line);
    p->count++;
}

static int check_attrs(hid_t fid, problems *p, mkv_dump_meta *m)
{
    mkv_error e;
    char fmt[64];
    int64_t v;
    if (!mkv_h5_has_attr(fid, "mkv_format")) {
        problem(p, "not a mosaickv dump: no mkv_format attribute");
        return -1;
    }
    if (mkv_h5_attr_get_str(fid, "mkv_format", fmt, sizeof fmt, &e)) {
        problem(p, "%s", e.msg);
        return -1;
    }
    if (strcmp(fmt, MKV_DUMP_FORMAT) != 0) {
        problem(p, "mkv_format is '%s', expected '%s'", fmt, MKV_DUMP_FORMAT);
        return -1;
    }
    if (mkv_h5_attr_get_int(fid, "mkv_version", &v, &e)) {
        problem(p, "%s", e.msg);
        return -1;
    }
    if (v != MKV_DUMP_VERSION) {
        problem(p, "unsupported mkv_version %" PRId64 " (this build reads version %d)", v, MKV_DUMP_VERSION);
        return -1;
    }
    mkv_dump_meta_init(m);
    int bad = 0;
    struct { const char *name; int *dst; } ints[] = {
        {"n_layers", &m->n_layers}, {"n_heads", &m->n_heads},
        {"n_kv_heads", &m->n_kv_heads}, {"head_dim", &m->head_dim},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        if (mkv_h5_attr_get_int(fid, ints[i].name, &v, &e)) {
            problem(p, "%s", e.msg);
            bad = 1;
        } else {
            /* clamped into int: the model check below refuses it then */
            *ints[i].dst = v < INT_MIN ? INT_MIN : v > INT_MAX ? INT_MAX : (int)v;
        }
    }
    if (mkv_h5_attr_get_double(fid, "rope_theta", &m->rope_theta, &e)) {
        problem(p, "%s", e.msg);
        bad = 1;
    }
    struct { const char *name; char *dst; size_t size; } strs[] = {
        {"model", m->model, sizeof m->model},
        {"k_rope", m->k_rope, sizeof m->k_rope},
        {"source", m->source, sizeof m->source},
        {"created_by", m->created_by, sizeof m->created_by},
    };
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) {
        if (mkv_h5_attr_get_str(fid, strs[i].name, strs[i].dst, strs[i].size, &e)) {
            problem(p, "%s", e.msg);
            bad = 1;
        }
    }
    if (!bad && mkv_dump_check_model(m, &e)) {
        problem(p, "%s", e.msg);
        bad = 1;
    }
    return bad ? -1 : 0;
}

/* Scan a dataset in blocks of tokens for NaN/Inf. */
static void scan_values(hid_t ds, const char *name, mkv_dtype t, hsize_t dims[3], problems *p)
{
    const int64_t block = 4096;
    size_t cap = (size_t)block * dims[2];
    float *buf = malloc(cap * sizeof(float));
    if (!buf) {
        problem(p, "%s: out of memory while checking values", name);
        return;
    }
    uint64_t nonfinite = 0;
    int64_t first[3] = {0, 0, 0};
    int first_nan = 0, first_neg = 0;
    for (hsize_t h = 0; h < dims[0]; h++)
        for (int64_t t0 = 0; t0 < (int64_t)dims[1]; t0 += block) {
            int64_t nt = (int64_t)dims[1] - t0 < block ? (int64_t)dims[1] - t0 : block;
            mkv_error e;
            if (mkv_dump_read_slab(ds, t, (int)h, 1, t0, nt, (int)dims[2], buf, &e)) {
                problem(p, "%s: %s", name, e.msg);
                free(buf);
                return;
            }
            for (size_t i = 0; i < (size_t)nt * dims[2]; i++)
                if (!isfinite(buf[i])) {
                    if (nonfinite++ == 0) {
                        first[0] = (int64_t)h;
                        first[1] = t0 + (int64_t)(i / dims[2]);
                        first[2] = (int64_t)(i % dims[2]);
                        first_nan = isnan(buf[i]);
                        first_neg = signbit(buf[i]) != 0;
                    }
                }
        }
    free(buf);
    if (nonfinite)
        problem(p, "%s: %s at [%" PRId64 ",%" PRId64 ",%" PRId64 "] (%" PRIu64 " non-finite value%s)", name,
                first_nan ? "NaN" : first_neg ? "-Inf" : "Inf", first[0], first[1], first[2], nonfinite, nonfinite == 1 ? "" : "s");
}

/* Check /layers/NN/<kind>; returns 1 if its shape and type are right and
 * the file can hold it. With scan, also check its values. */
static int check_tensor(hid_t fid, const mkv_dump_meta *m, int layer, char kind, int64_t *len,
                        hsize_t file_size, problems *p, int scan)
{
    char name[64], why[128];
    mkv_dump_dset_name(name, sizeof name, layer, kind);
    if (!mkv_h5_has_link(fid, name)) {
        problem(p, "missing dataset %s", name);
        return 0;
    }
    hid_t ds = H5Dopen2(fid, name, H5P_DEFAULT);
    if (ds < 0) {
        problem(p, "%s is not a dataset", name);
        return 0;
    }
    int ok = 1;
    mkv_dtype t;
    if (mkv_dump_dset_dtype(ds, &t, why, sizeof why)) {
        problem(p, "%s: %s", name, why);
        ok = 0;
    }
    hsize_t dims[3] = {0, 0, 0};
    int rank = mkv_dump_dset_dims(ds, dims);
    int64_t rows = kind == 'q' ? m->n_heads : m->n_kv_heads;
    if (rank != 3) {
        problem(p, "%s has rank %d, expected 3", name, rank);
        ok = 0;
    } else {
        if (*len < 0)
            *len = (int64_t)dims[1];
        if ((int64_t)dims[0] != rows || (int64_t)dims[1] != *len || (int64_t)dims[2] != m->head_dim) {
            problem(p, "%s: shape [%llu,%llu,%llu] does not match %s=%" PRId64 ", %s=%" PRId64 ", head_dim=%d",
                    name, (unsigned long long)dims[0], (unsigned long long)dims[1], (unsigned long long)dims[2],
                    kind == 'q' ? "n_heads" : "n_kv_heads", rows, kind == 'q' ? "W" : "T", *len, m->head_dim);
            ok = 0;
        }
    }
    mkv_error e;
    if (ok && mkv_dump_check_extent(ds, name, 3, dims, file_size, &e)) {
        problem(p, "%s", e.msg);
        ok = 0;
    }
    if (ok && scan)
        scan_values(ds, name, t, dims, p);
    H5Dclose(ds);
    return ok;
}

/* Read the 1-D integer dataset name of expect values (any count when
 * expect < 0, as many as the file can hold), each of which must be in
 * lo..hi (what names one in the problem); returns 1 if it is all right. */
static int check_index(hid_t fid, const char *name, int64_t expect, int64_t lo, int64_t hi,
                       const char *what, hsize_t file_size, problems *p)
{
    hid_t ds = H5Dopen2(fid, name, H5P_DEFAULT);
    if (ds < 0) {
        problem(p, "%s is not a dataset", name);
        return 0;
    }
    hsize_t dims[3];
    int rank = mkv_dump_dset_dims(ds, dims);
    hid_t t = H5Dget_type(ds);
    int is_int = t >= 0 && H5Tget_class(t) == H5T_INTEGER;
    if (t >= 0)
        H5Tclose(t);
    int32_t *v = NULL;
    int ok = 0;
    mkv_error e;
    int64_t bad, bad_value;
    if (!is_int)
        problem(p, "%s is not an integer dataset", name);
    else if (rank != 1)
        problem(p, "%s has rank %d, expected 1", name, rank);
    else if (expect >= 0 && (int64_t)dims[0] != expect)
        problem(p, "%s has %llu elements, expected %" PRId64, name, (unsigned long long)dims[0], expect);
    else if (mkv_dump_check_extent(ds, name, 1, dims, file_size, &e))
        problem(p, "%s", e.msg);
    else if (!(v = malloc((dims[0] ? dims[0] : 1) * sizeof(int32_t))))
        problem(p, "%s: out of memory", name);
    else if (mkv_dump_read_ints(ds, (int64_t)dims[0], lo, hi, v, &bad, &bad_value, &e))
        problem(p, "%s: %s", name, e.msg);
    else if (bad >= 0)
        problem(p, "%s: %s %" PRId64 " at index %" PRId64 " is outside %" PRId64 "..%" PRId64, name, what,
                bad_value, bad, lo, hi);
    else
        ok = 1;
    free(v);
    H5Dclose(ds);
    return ok;
}

static herr_t note_child(hid_t g, const char *name, const H5L_info_t *info, void *op_data)
{
    const void **args = op_data;
    const mkv_dump_meta *m = args[0];
    problems *p = (problems *)args[1];
    char *end;
    long l = strtol(name, &end, 10);
    char expect[16];
    snprintf(expect, sizeof expect, "%02ld", l);
    if (*end || l < 0 || l >= m->n_layers || strcmp(expect, name) != 0)
        problem(p, "unexpected /layers/%s (n_layers=%d)", name, m->n_layers);
    return 0;
}

int mkv_dump_validate(const char *path, mkv_problem_fn report, void *ctx, mkv_error *err)
{
    hid_t fid;
    if (mkv_h5_open_read(path, &fid, err))
        return -1;
    problems p = {report, ctx, 0};
    mkv_dump_meta m;
    if (check_attrs(fid, &p, &m) == 0) {
        /* T from /tokens when it is there, so one bad k dataset is blamed
         * alone instead of every good one */
        int64_t T = -1, W = -1;
        if (mkv_h5_has_link(fid, "/tokens")) {
            hid_t ds = H5Dopen2(fid, "/tokens", H5P_DEFAULT);
            hsize_t dims[3];
            if (ds >= 0 && mkv_dump_dset_dims(ds, dims) == 1)
                T = (int64_t)dims[0];
            if (ds >= 0)
                H5Dclose(ds);
        }
        /* every shape first: values are scanned only once the shapes
         * agree and the file can hold them */
        hsize_t file_size = 0;
        if (H5Fget_filesize(fid, &file_size) < 0)
            problem(&p, "cannot read the file's size");
        int shapes_ok = 1;
        for (int l = 0; l < m.n_layers && file_size; l++) {
            shapes_ok &= check_tensor(fid, &m, l, 'k', &T, file_size, &p, 0);
            shapes_ok &= check_tensor(fid, &m, l, 'v', &T, file_size, &p, 0);
            shapes_ok &= check_tensor(fid, &m, l, 'q', &W, file_size, &p, 0);
        }
        for (int l = 0; l < m.n_layers && file_size && shapes_ok; l++)
            for (int k = 0; k < 3; k++)
                check_tensor(fid, &m, l, "kvq"[k], k == 2 ? &W : &T, file_size, &p, 1);
        if (T == 0)
            problem(&p, "the dump holds no tokens (T=0)");
        if (mkv_h5_has_link(fid, "/layers")) {
            const void *args[2] = {&m, &p};
            hid_t g = H5Gopen2(fid, "/layers", H5P_DEFAULT);
            if (g >= 0) {
                H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, NULL, note_child, args);
                H5Gclose(g);
            }
        }
        if (mkv_h5_has_link(fid, "/tokens") && file_size)
            check_index(fid, "/tokens", T, 0, INT32_MAX, "token id", file_size, &p);
        if (!mkv_h5_has_link(fid, "/query_pos"))
            problem(&p, "missing dataset /query_pos");
        else if (T > 0 && file_size)
            /* a query at position p attends to tokens 0..p */
            check_index(fid, "/query_pos", W, 0, T - 1, "position", file_size, &p);
    }
    H5Fclose(fid);
    return p.count;
}
