/* Full validation of a dump: every attribute, shape, type, index range and
 * value, reporting each problem found rather than stopping at the first. */
#include "config.h"
#include "io/dump.h"
#include "io/dump_priv.h"

#include <inttypes.h>
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
    /* the same limits mkv_dump_meta_check applies when a dump is opened */
    struct { const char *name; int *dst; int64_t max; } ints[] = {
        {"n_layers", &m->n_layers, 1000}, {"n_heads", &m->n_heads, 1000000},
        {"n_kv_heads", &m->n_kv_heads, 1000000}, {"head_dim", &m->head_dim, 4096},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        if (mkv_h5_attr_get_int(fid, ints[i].name, &v, &e)) {
            problem(p, "%s", e.msg);
            bad = 1;
        } else if (v <= 0 || v > ints[i].max) {
            problem(p, "attribute %s=%" PRId64 " is out of range 1..%" PRId64, ints[i].name, v, ints[i].max);
            bad = 1;
        } else {
            *ints[i].dst = (int)v;
        }
    }
    if (!bad && m->n_heads % m->n_kv_heads != 0) {
        problem(p, "n_heads=%d is not a multiple of n_kv_heads=%d", m->n_heads, m->n_kv_heads);
        bad = 1;
    }
    if (mkv_h5_attr_get_double(fid, "rope_theta", &m->rope_theta, &e))
        problem(p, "%s", e.msg);
    else if (!(m->rope_theta > 0) || !isfinite(m->rope_theta))
        problem(p, "attribute rope_theta=%g must be positive", m->rope_theta);
    struct { const char *name; char *dst; size_t size; const char *allowed; } strs[] = {
        {"model", m->model, sizeof m->model, NULL},
        {"k_rope", m->k_rope, sizeof m->k_rope, "post pre"},
        {"source", m->source, sizeof m->source, "capture import synthetic"},
        {"created_by", m->created_by, sizeof m->created_by, NULL},
    };
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) {
        char value[512];
        if (mkv_h5_attr_get_str(fid, strs[i].name, value, sizeof value, &e)) {
            problem(p, "%s", e.msg);
            continue;
        }
        snprintf(strs[i].dst, strs[i].size, "%s", value);
        if (strs[i].allowed) {
            /* whole-word match in the list of allowed values */
            const char *s = strs[i].allowed;
            size_t n = strlen(value);
            int ok = 0;
            while (s && *s && !ok) {
                const char *sp = strchr(s, ' ');
                size_t len = sp ? (size_t)(sp - s) : strlen(s);
                ok = n > 0 && len == n && strncmp(s, value, n) == 0;
                s = sp ? sp + 1 : NULL;
            }
            if (!ok)
                problem(p, "attribute %s='%s' is not one of: %s", strs[i].name, value, strs[i].allowed);
        }
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

/* Check /layers/NN/<kind>; returns 1 if its shape and type are right. */
static int check_tensor(hid_t fid, const mkv_dump_meta *m, int layer, char kind, int64_t *len,
                        problems *p, int scan)
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
    if (ok && scan)
        scan_values(ds, name, t, dims, p);
    H5Dclose(ds);
    return ok;
}

/* Read a 1-D integer dataset whole; NULL (with a problem) if it is not one. */
static int32_t *read_index(hid_t fid, const char *name, int64_t expect, problems *p)
{
    hid_t ds = H5Dopen2(fid, name, H5P_DEFAULT);
    if (ds < 0) {
        problem(p, "%s is not a dataset", name);
        return NULL;
    }
    hsize_t dims[3];
    int rank = mkv_dump_dset_dims(ds, dims);
    hid_t t = H5Dget_type(ds);
    int is_int = t >= 0 && H5Tget_class(t) == H5T_INTEGER;
    if (t >= 0)
        H5Tclose(t);
    int32_t *v = NULL;
    if (!is_int)
        problem(p, "%s is not an integer dataset", name);
    else if (rank != 1)
        problem(p, "%s has rank %d, expected 1", name, rank);
    else if (expect >= 0 && (int64_t)dims[0] != expect)
        problem(p, "%s has %llu elements, expected %" PRId64, name, (unsigned long long)dims[0], expect);
    else if (!(v = malloc((dims[0] ? dims[0] : 1) * sizeof(int32_t))))
        problem(p, "%s: out of memory", name);
    else if (dims[0] && H5Dread(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) < 0) {
        problem(p, "%s: cannot read (values out of int32 range or damaged data)", name);
        free(v);
        v = NULL;
    }
    H5Dclose(ds);
    return v;
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
        for (int l = 0; l < m.n_layers; l++) {
            check_tensor(fid, &m, l, 'k', &T, &p, 1);
            check_tensor(fid, &m, l, 'v', &T, &p, 1);
            check_tensor(fid, &m, l, 'q', &W, &p, 1);
        }
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
        if (mkv_h5_has_link(fid, "/tokens")) {
            int32_t *tok = read_index(fid, "/tokens", T, &p);
            for (int64_t i = 0; tok && i < T; i++)
                if (tok[i] < 0) {
                    problem(&p, "/tokens: negative token id %d at %" PRId64, tok[i], i);
                    break;
                }
            free(tok);
        }
        if (!mkv_h5_has_link(fid, "/query_pos")) {
            problem(&p, "missing dataset /query_pos");
        } else {
            int32_t *pos = read_index(fid, "/query_pos", W, &p);
            int64_t n = W;
            for (int64_t i = 0; pos && i < n; i++)
                if (T >= 0 && (pos[i] < 0 || pos[i] >= T)) {
                    problem(&p, "/query_pos: position %d at index %" PRId64 " is outside 0..%" PRId64,
                            pos[i], i, T - 1);
                    break;
                }
            free(pos);
        }
    }
    H5Fclose(fid);
    return p.count;
}
