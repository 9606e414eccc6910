/* Compressed KV dumps: atomic writer with structural byte accounting and a
 * validating reader (lib/io/cdump.h, man/mosaickv.5).
 *
 * Methods compress heads in parallel, and the HDF5 library Debian ships is
 * not thread-safe, so every HDF5 call in this file holds one process-wide
 * lock. Callers must not run other HDF5 code (lib/io/dump.c) at the same time.
 *
 * The writer keeps a head's arrays in memory until the caller moves on to a
 * later layer (or commits), then writes whole layers in (layer, head, put)
 * order: the file is the same byte for byte whatever the thread schedule. */
#include "config.h"
#include "io/cdump.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hdf5.h>

#include "io/dump_priv.h"
#include "io/h5file.h"
#include "core/half.h"
#include "core/log.h"
#include "core/tensor.h"

static pthread_mutex_t h5_lock = PTHREAD_MUTEX_INITIALIZER;
#define LOCK() pthread_mutex_lock(&h5_lock)
#define UNLOCK() pthread_mutex_unlock(&h5_lock)

#define NAME_MAX_LEN 64

size_t mkv_el_size(mkv_el_type t)
{
    switch (t) {
    case MKV_EL_F16: return 2;
    case MKV_EL_F16_BITS: return 2;
    case MKV_EL_F32: return 4;
    case MKV_EL_F32_OR_NAN: return 4;
    case MKV_EL_U8: return 1;
    case MKV_EL_I16: return 2;
    case MKV_EL_I32: return 4;
    }
    return 0;
}

static const char *el_name(mkv_el_type t)
{
    static const char *names[] = {"float16", "float32", "uint8", "int16", "int32", "float32", "float16"};
    return (unsigned)t < sizeof names / sizeof *names ? names[t] : "unknown";
}

/* Size of one element in the caller's buffers (float32 for the float
 * types but MKV_EL_F16_BITS). */
static size_t mem_size(mkv_el_type t) { return t == MKV_EL_F16 ? 4 : mkv_el_size(t); }

static hid_t file_type(mkv_el_type t, hid_t f16)
{
    switch (t) {
    case MKV_EL_F16:
    case MKV_EL_F16_BITS: return f16;
    case MKV_EL_F32:
    case MKV_EL_F32_OR_NAN: return H5T_IEEE_F32LE;
    case MKV_EL_U8: return H5T_STD_U8LE;
    case MKV_EL_I16: return H5T_STD_I16LE;
    case MKV_EL_I32: return H5T_STD_I32LE;
    }
    return -1;
}

static hid_t mem_type(mkv_el_type t, hid_t f16)
{
    switch (t) {
    case MKV_EL_F16:      /* converted by lib/core/half.c beforehand */
    case MKV_EL_F16_BITS: return f16;
    case MKV_EL_F32:
    case MKV_EL_F32_OR_NAN: return H5T_NATIVE_FLOAT;
    case MKV_EL_U8: return H5T_NATIVE_UINT8;
    case MKV_EL_I16: return H5T_NATIVE_INT16;
    case MKV_EL_I32: return H5T_NATIVE_INT32;
    }
    return -1;
}

static void head_path(char *buf, size_t size, int layer, int head, const char *name)
{
    if (name)
        snprintf(buf, size, "/layers/%02d/%02d/%s", layer, head, name);
    else
        snprintf(buf, size, "/layers/%02d/%02d", layer, head);
}

/* Groups and datasets without modification times: same input, same bytes. */
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

/* Contiguous, unfiltered dataset (written at once, so no fill either). */
static hid_t create_dset(hid_t loc, const char *name, hid_t type, int rank, const hsize_t *dims)
{
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (dcpl < 0)
        return -1;
    H5Pset_obj_track_times(dcpl, 0);
    H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
    hid_t space = H5Screate_simple(rank, dims, NULL);
    hid_t ds = space >= 0 ? H5Dcreate2(loc, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT) : -1;
    if (space >= 0)
        H5Sclose(space);
    H5Pclose(dcpl);
    return ds;
}

/* ================================================================ writer */

typedef enum { ENTRY_ARRAY, ENTRY_ATTR_INT, ENTRY_ATTR_DOUBLE } entry_kind;

/* Something put for a head and not yet written to the file. */
typedef struct entry {
    entry_kind kind;
    char name[NAME_MAX_LEN];
    mkv_el_type type;
    int rank;
    hsize_t dims[3];
    size_t numel;
    void *data;            /* storage form: fp16 bits, float32 or the integers */
    int64_t ival;
    double dval;
    struct entry *next;
} entry;

typedef struct {
    entry *first, *last;   /* pending, in put order */
    char (*names)[NAME_MAX_LEN];   /* every array stored, to refuse duplicates */
    int n_names, cap_names;
    uint64_t bytes;
} head_state;

struct mkv_cdump {
    char *path;
    hid_t fid;
    mkv_cdump_meta meta;
    int first_layer, end_layer;  /* the layers it holds: all, or one (mkv_cdump_create_memory_layer) */
    int32_t *query_pos;    /* [W] */
};

struct mkv_cdump_writer {
    mkv_h5_out out;
    mkv_cdump_meta meta;
    hid_t f16;
    head_state *heads;     /* [n_layers][n_kv_heads] */
    int first_layer, end_layer;  /* the layers it takes */
    int latest_layer;      /* highest layer put so far: earlier ones get written */
    uint64_t total;
    int failed;            /* a write failed: nothing more is written */
    mkv_error write_err;
};

static head_state *head_of(const mkv_cdump_writer *w, int layer, int head)
{
    return &w->heads[(size_t)layer * (size_t)w->meta.raw.n_kv_heads + (size_t)head];
}

static int check_head(const mkv_cdump_writer *w, int layer, int head, mkv_error *err)
{
    if (layer < 0 || layer >= w->meta.raw.n_layers || head < 0 || head >= w->meta.raw.n_kv_heads)
        return mkv_fail(err, MKV_EUSAGE, "layer %d head %d is outside the dump (%d layers, %d KV heads)",
                        layer, head, w->meta.raw.n_layers, w->meta.raw.n_kv_heads);
    if (layer < w->first_layer || layer >= w->end_layer)
        return mkv_fail(err, MKV_EUSAGE, "layer %d is not the layer this in-memory dump holds (%d)", layer,
                        w->first_layer);
    return MKV_OK;
}

/* Array names: one or two components of [A-Za-z0-9_.-], e.g. "k/values". */
static int check_name(const char *name, int layer, int head, mkv_error *err)
{
    size_t len = strlen(name);
    int slashes = 0, ok = len > 0 && len < NAME_MAX_LEN && name[0] != '/' && name[len - 1] != '/';
    for (size_t i = 0; ok && i < len; i++) {
        char c = name[i];
        if (c == '/')
            ok = ++slashes <= 1 && name[i + 1] != '/';
        else
            ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '_' || c == '-' || (c == '.' && i > 0 && name[i - 1] != '/');
    }
    if (!ok)
        return mkv_fail(err, MKV_EUSAGE,
                        "layer %d head %d: invalid array name '%s' (one or two components of "
                        "letters, digits, '_', '-', '.', at most %d characters)",
                        layer, head, name, NAME_MAX_LEN - 1);
    return MKV_OK;
}

/* a and b cannot both exist when equal or when one is a group holding the other. */
static int names_clash(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la == lb)
        return strcmp(a, b) == 0;
    if (la > lb)
        return strncmp(a, b, lb) == 0 && a[lb] == '/';
    return strncmp(a, b, la) == 0 && b[la] == '/';
}

static void free_entries(head_state *hs)
{
    for (entry *e = hs->first, *next; e; e = next) {
        next = e->next;
        mkv_free(e->data);
        free(e);
    }
    hs->first = hs->last = NULL;
}

static int write_array(mkv_cdump_writer *w, hid_t hg, int layer, int head, const entry *e, mkv_error *err)
{
    char path[128];
    head_path(path, sizeof path, layer, head, e->name);
    hid_t loc = hg, sub = -1;
    const char *leaf = e->name;
    const char *slash = strchr(e->name, '/');
    if (slash) {
        char group[NAME_MAX_LEN];
        memcpy(group, e->name, (size_t)(slash - e->name));
        group[slash - e->name] = '\0';
        sub = H5Lexists(hg, group, H5P_DEFAULT) > 0 ? H5Gopen2(hg, group, H5P_DEFAULT) : create_group(hg, group);
        if (sub < 0)
            return mkv_fail(err, MKV_EIO, "cannot create group %s", path);
        loc = sub;
        leaf = slash + 1;
    }
    int rc = MKV_OK;
    hid_t ds = create_dset(loc, leaf, file_type(e->type, w->f16), e->rank, e->dims);
    if (ds < 0)
        rc = mkv_fail(err, MKV_EIO, "cannot create dataset %s", path);
    else if (e->numel > 0 && H5Dwrite(ds, mem_type(e->type, w->f16), H5S_ALL, H5S_ALL, H5P_DEFAULT, e->data) < 0)
        rc = mkv_fail(err, MKV_EIO, "%s: write failed (disk full?)", path);
    if (ds >= 0)
        H5Dclose(ds);
    if (sub >= 0)
        H5Gclose(sub);
    return rc;
}

/* Write what is pending for every head of layers < end. Called locked. */
static int flush_layers(mkv_cdump_writer *w, int end, mkv_error *err)
{
    if (w->failed) {
        if (err)
            *err = w->write_err;
        return w->write_err.code;
    }
    for (int l = 0; l < end; l++)
        for (int h = 0; h < w->meta.raw.n_kv_heads; h++) {
            head_state *hs = head_of(w, l, h);
            if (!hs->first)
                continue;
            char path[64];
            head_path(path, sizeof path, l, h, NULL);
            hid_t hg = H5Gopen2(w->out.fid, path, H5P_DEFAULT);
            int rc = hg < 0 ? mkv_fail(&w->write_err, MKV_EIO, "cannot open group %s", path) : MKV_OK;
            for (entry *e = hs->first; e && rc == MKV_OK; e = e->next) {
                if (e->kind == ENTRY_ARRAY)
                    rc = write_array(w, hg, l, h, e, &w->write_err);
                else if (e->kind == ENTRY_ATTR_INT)
                    rc = mkv_h5_attr_put_int(hg, e->name, e->ival, &w->write_err);
                else
                    rc = mkv_h5_attr_put_double(hg, e->name, e->dval, &w->write_err);
                if (rc && e->kind != ENTRY_ARRAY)
                    mkv_error_prefix(&w->write_err, "%s", path);
            }
            if (hg >= 0)
                H5Gclose(hg);
            free_entries(hs);
            if (rc) {
                w->failed = 1;
                if (err)
                    *err = w->write_err;
                return rc;
            }
        }
    return MKV_OK;
}

/* Queue e for (layer, head); write earlier layers when a later one starts. */
static int enqueue(mkv_cdump_writer *w, int layer, int head, entry *e, uint64_t bytes, mkv_error *err)
{
    LOCK();
    head_state *hs = head_of(w, layer, head);
    if (e->kind == ENTRY_ARRAY) {
        for (int i = 0; i < hs->n_names; i++)
            if (names_clash(hs->names[i], e->name)) {
                mkv_fail(err, MKV_EUSAGE, "layer %d head %d: array '%s' clashes with '%s' stored before",
                         layer, head, e->name, hs->names[i]);
                UNLOCK();
                mkv_free(e->data);
                free(e);
                return MKV_EUSAGE;
            }
        if (hs->n_names == hs->cap_names) {
            int cap = hs->cap_names ? 2 * hs->cap_names : 8;
            void *grown = realloc(hs->names, (size_t)cap * sizeof *hs->names);
            if (!grown) {
                UNLOCK();
                mkv_free(e->data);
                free(e);
                return mkv_fail(err, MKV_ENOMEM, "out of memory");
            }
            hs->names = grown;
            hs->cap_names = cap;
        }
        memcpy(hs->names[hs->n_names++], e->name, NAME_MAX_LEN);
        hs->bytes += bytes;
        w->total += bytes;
    }
    if (hs->last)
        hs->last->next = e;
    else
        hs->first = e;
    hs->last = e;
    int rc = MKV_OK;
    if (layer > w->latest_layer) {
        w->latest_layer = layer;
        rc = flush_layers(w, layer, err);
    }
    UNLOCK();
    return rc;
}

static int write_root_attrs(mkv_cdump_writer *w, const int32_t *query_pos, mkv_error *err)
{
    hid_t f = w->out.fid;
    const mkv_cdump_meta *c = &w->meta;
    const mkv_dump_meta *m = &c->raw;
    char created_by[64];
    snprintf(created_by, sizeof created_by, "mosaickv %s", PACKAGE_VERSION);
    int rc;
    if ((rc = mkv_h5_attr_put_str(f, "mkv_format", MKV_CDUMP_FORMAT, err)) ||
        (rc = mkv_h5_attr_put_int(f, "mkv_version", MKV_CDUMP_VERSION, err)) ||
        (rc = mkv_h5_attr_put_str(f, "method", c->method, err)) ||
        (rc = mkv_h5_attr_put_str(f, "params", c->params, err)) ||
        (rc = mkv_h5_attr_put_str(f, "model", m->model, err)) ||
        (rc = mkv_h5_attr_put_int(f, "n_layers", m->n_layers, err)) ||
        (rc = mkv_h5_attr_put_int(f, "n_heads", m->n_heads, err)) ||
        (rc = mkv_h5_attr_put_int(f, "n_kv_heads", m->n_kv_heads, err)) ||
        (rc = mkv_h5_attr_put_int(f, "head_dim", m->head_dim, err)) ||
        (rc = mkv_h5_attr_put_int(f, "n_tokens", m->n_tokens, err)) ||
        (rc = mkv_h5_attr_put_double(f, "rope_theta", m->rope_theta, err)) ||
        (rc = mkv_h5_attr_put_str(f, "k_rope", m->k_rope, err)) ||
        (rc = mkv_h5_attr_put_str(f, "source", c->source, err)) ||
        (rc = mkv_h5_attr_put_str(f, "raw_source", m->source, err)) ||
        (rc = mkv_h5_attr_put_str(f, "created_by", created_by, err)))
        return rc;
    hsize_t W = (hsize_t)m->n_queries;
    hid_t ds = create_dset(f, "query_pos", H5T_STD_I32LE, 1, &W);
    if (ds < 0)
        return mkv_fail(err, MKV_EIO, "cannot create /query_pos");
    if (W > 0 && H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, query_pos) < 0)
        rc = mkv_fail(err, MKV_EIO, "/query_pos: write failed");
    H5Dclose(ds);
    if (rc)
        return rc;

    hid_t layers = create_group(f, "layers");
    if (layers < 0)
        return mkv_fail(err, MKV_EIO, "cannot create group /layers");
    for (int l = w->first_layer; l < w->end_layer && !rc; l++) {
        char name[16];
        snprintf(name, sizeof name, "%02d", l);
        hid_t lg = create_group(layers, name);
        for (int h = 0; lg >= 0 && h < m->n_kv_heads; h++) {
            char hname[16];
            snprintf(hname, sizeof hname, "%02d", h);
            hid_t hg = create_group(lg, hname);
            if (hg < 0) {
                H5Gclose(lg);
                lg = -1;
            } else {
                H5Gclose(hg);
            }
        }
        if (lg < 0)
            rc = mkv_fail(err, MKV_EIO, "cannot create the groups of /layers/%s", name);
        else
            H5Gclose(lg);
    }
    H5Gclose(layers);
    return rc;
}

static uint64_t head_logical_bytes(const mkv_dump_meta *m)
{
    return 2 * (uint64_t)m->n_tokens * (uint64_t)m->head_dim * 2;
}

static void writer_free(mkv_cdump_writer *w)
{
    if (w->heads) {
        size_t n = (size_t)w->meta.raw.n_layers * (size_t)w->meta.raw.n_kv_heads;
        for (size_t i = 0; i < n; i++) {
            free_entries(&w->heads[i]);
            free(w->heads[i].names);
        }
        free(w->heads);
    }
    if (w->f16 >= 0)
        H5Tclose(w->f16);
    free(w);
}

/* path NULL: in memory; layer >= 0: that layer alone */
static int create_writer(const char *path, const char *protect, const mkv_cdump_meta *meta,
                         const int32_t *query_pos, int layer, mkv_cdump_writer **out, mkv_error *err)
{
    *out = NULL;
    const mkv_dump_meta *m = &meta->raw;
    int rc = mkv_dump_meta_check(m, err);
    if (rc)
        return rc;
    if (!meta->method[0] || strpbrk(meta->method, " \t\n="))
        return mkv_fail(err, MKV_EUSAGE, "invalid method name '%s'", meta->method);
    for (int64_t i = 0; i < m->n_queries; i++)
        if (query_pos[i] < 0 || query_pos[i] >= m->n_tokens)
            return mkv_fail(err, MKV_EFORMAT, "query position %d at index %" PRId64 " is outside 0..%" PRId64,
                            query_pos[i], i, m->n_tokens - 1);

    if (layer >= m->n_layers)
        return mkv_fail(err, MKV_EUSAGE, "layer %d is outside the dump (%d layers)", layer, m->n_layers);
    mkv_cdump_writer *w = calloc(1, sizeof *w);
    if (!w)
        return mkv_fail(err, MKV_ENOMEM, "out of memory");
    w->meta = *meta;
    w->first_layer = layer >= 0 ? layer : 0;
    w->end_layer = layer >= 0 ? layer + 1 : m->n_layers;
    w->meta.logical_bytes = (uint64_t)(w->end_layer - w->first_layer) * (uint64_t)m->n_kv_heads *
                            head_logical_bytes(m);
    w->meta.physical_bytes = 0;
    w->latest_layer = -1;
    w->out.fid = H5I_INVALID_HID;
    w->f16 = -1;
    w->heads = calloc((size_t)m->n_layers * (size_t)m->n_kv_heads, sizeof *w->heads);
    if (!w->heads) {
        writer_free(w);
        return mkv_fail(err, MKV_ENOMEM, "out of memory");
    }
    LOCK();
    w->f16 = mkv_h5_f16_type();
    if (w->f16 < 0)
        rc = mkv_fail(err, MKV_EIO, "cannot make the HDF5 float16 type");
    else if ((rc = path ? mkv_h5_create(path, protect, &w->out, err) : mkv_h5_create_memory(&w->out, err)) ==
                 MKV_OK &&
             (rc = write_root_attrs(w, query_pos, err)) != MKV_OK)
        mkv_h5_discard(&w->out);
    UNLOCK();
    if (rc) {
        writer_free(w);
        return rc;
    }
    *out = w;
    return MKV_OK;
}

int mkv_cdump_create(const char *path, const char *protect, const mkv_cdump_meta *meta,
                     const int32_t *query_pos, mkv_cdump_writer **out, mkv_error *err)
{
    return create_writer(path, protect, meta, query_pos, -1, out, err);
}

int mkv_cdump_create_memory(const mkv_cdump_meta *meta, const int32_t *query_pos, mkv_cdump_writer **out,
                            mkv_error *err)
{
    return create_writer(NULL, NULL, meta, query_pos, -1, out, err);
}

int mkv_cdump_create_memory_layer(const mkv_cdump_meta *meta, const int32_t *query_pos, int layer,
                                  mkv_cdump_writer **out, mkv_error *err)
{
    if (layer < 0)
        return mkv_fail(err, MKV_EUSAGE, "layer %d is outside the dump", layer);
    return create_writer(NULL, NULL, meta, query_pos, layer, out, err);
}

/* "[i,j,k]" of flat index i in an array of the given dims. */
static void format_index(size_t i, int rank, const int64_t *dims, char *buf, size_t size)
{
    size_t idx[3] = {0, 0, 0};
    for (int r = rank - 1; r >= 0; r--) {
        idx[r] = dims[r] ? i % (size_t)dims[r] : 0;
        i = dims[r] ? i / (size_t)dims[r] : 0;
    }
    if (rank == 1)
        snprintf(buf, size, "[%zu]", idx[0]);
    else if (rank == 2)
        snprintf(buf, size, "[%zu,%zu]", idx[0], idx[1]);
    else
        snprintf(buf, size, "[%zu,%zu,%zu]", idx[0], idx[1], idx[2]);
}

/* Index of the first fp16 NaN or infinity (exponent bits all set) of x [n],
 * or -1. */
static int64_t find_nonfinite_f16(const uint16_t *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((x[i] & 0x7c00) == 0x7c00)
            return (int64_t)i;
    return -1;
}

static const char *f16_nonfinite_name(uint16_t h)
{
    return h & 0x03ff ? "NaN" : h & 0x8000 ? "-Inf" : "Inf";
}

/* Copy data into the storage form, refusing what the type cannot hold. */
static int to_storage(const char *label, mkv_el_type type, int rank, const int64_t *dims, const void *data,
                      size_t numel, void *dst, mkv_error *err)
{
    if (type == MKV_EL_F16 || type == MKV_EL_F32 || type == MKV_EL_F32_OR_NAN) {
        const float *x = data;
        for (size_t i = 0; i < numel; i++) {
            /* the largest float16 is 65504; beyond it rounding gives Inf */
            int nonfinite = type == MKV_EL_F32_OR_NAN ? isinf(x[i]) : !isfinite(x[i]);
            int too_big = type == MKV_EL_F16 && fabsf(x[i]) >= 65520.0f;
            if (nonfinite || too_big) {
                char at[80];
                format_index(i, rank, dims, at, sizeof at);
                if (nonfinite)
                    return mkv_fail(err, MKV_EFORMAT, "%s: %s at %s", label,
                                    x[i] != x[i] ? "NaN" : x[i] < 0 ? "-Inf" : "Inf", at);
                return mkv_fail(err, MKV_EFORMAT, "%s: value %g at %s does not fit float16", label, (double)x[i], at);
            }
        }
        if (type == MKV_EL_F16)
            mkv_f32_to_f16_n(x, dst, numel);
        else
            memcpy(dst, x, numel * 4);
        return MKV_OK;
    }
    if (type == MKV_EL_F16_BITS) {
        int64_t bad = find_nonfinite_f16(data, numel);
        if (bad >= 0) {
            char at[80];
            format_index((size_t)bad, rank, dims, at, sizeof at);
            return mkv_fail(err, MKV_EFORMAT, "%s: %s at %s", label, f16_nonfinite_name(((const uint16_t *)data)[bad]), at);
        }
    }
    memcpy(dst, data, numel * mkv_el_size(type));
    return MKV_OK;
}

int mkv_cdump_put(mkv_cdump_writer *w, int layer, int head, const char *name, mkv_el_type type,
                  int rank, const int64_t *dims, const void *data, mkv_error *err)
{
    int rc;
    if ((rc = check_head(w, layer, head, err)) || (rc = check_name(name, layer, head, err)))
        return rc;
    if (mkv_el_size(type) == 0)
        return mkv_fail(err, MKV_EUSAGE, "layer %d head %d: '%s': unknown element type %d", layer, head, name, (int)type);
    if (rank < 1 || rank > 3)
        return mkv_fail(err, MKV_EUSAGE, "layer %d head %d: '%s': rank %d is outside 1..3", layer, head, name, rank);
    char label[128];
    snprintf(label, sizeof label, "layer %d head %d: '%s'", layer, head, name);
    size_t numel = 1;
    for (int i = 0; i < rank; i++) {
        if (dims[i] < 0)
            return mkv_fail(err, MKV_EUSAGE, "%s: negative dimension %" PRId64, label, dims[i]);
        if (mkv_mul_size(numel, (size_t)dims[i], &numel))
            return mkv_fail(err, MKV_ENOMEM, "%s: size overflows", label);
    }
    if (numel > 0 && !data)
        return mkv_fail(err, MKV_EUSAGE, "%s: no data", label);
    entry *e = calloc(1, sizeof *e);
    if (!e)
        return mkv_fail(err, MKV_ENOMEM, "out of memory");
    e->kind = ENTRY_ARRAY;
    snprintf(e->name, sizeof e->name, "%s", name);
    e->type = type;
    e->rank = rank;
    for (int i = 0; i < rank; i++)
        e->dims[i] = (hsize_t)dims[i];
    e->numel = numel;
    if (numel > 0) {
        e->data = mkv_alloc(numel, mkv_el_size(type), label, err);
        if (!e->data)
            rc = MKV_ENOMEM;
        else
            rc = to_storage(label, type, rank, dims, data, numel, e->data, err);
        if (rc) {
            mkv_free(e->data);
            free(e);
            return rc;
        }
    }
    return enqueue(w, layer, head, e, (uint64_t)numel * mkv_el_size(type), err);
}

static int put_attr(mkv_cdump_writer *w, int layer, int head, const char *name, entry_kind kind,
                    int64_t iv, double dv, mkv_error *err)
{
    int rc = check_head(w, layer, head, err);
    if (rc)
        return rc;
    size_t len = strlen(name);
    if (len == 0 || len >= NAME_MAX_LEN || strchr(name, '/'))
        return mkv_fail(err, MKV_EUSAGE, "layer %d head %d: invalid attribute name '%s'", layer, head, name);
    /* the writer's own accounting must not be overridden */
    if (strcmp(name, "logical_bytes") == 0 || strcmp(name, "physical_bytes") == 0)
        return mkv_fail(err, MKV_EUSAGE, "layer %d head %d: attribute '%s' is reserved", layer, head, name);
    if (kind == ENTRY_ATTR_DOUBLE && !isfinite(dv))
        return mkv_fail(err, MKV_EFORMAT, "layer %d head %d: attribute '%s' is not finite", layer, head, name);
    entry *e = calloc(1, sizeof *e);
    if (!e)
        return mkv_fail(err, MKV_ENOMEM, "out of memory");
    e->kind = kind;
    snprintf(e->name, sizeof e->name, "%s", name);
    e->ival = iv;
    e->dval = dv;
    return enqueue(w, layer, head, e, 0, err);
}

int mkv_cdump_put_attr_int(mkv_cdump_writer *w, int layer, int head, const char *name, int64_t v, mkv_error *err)
{
    return put_attr(w, layer, head, name, ENTRY_ATTR_INT, v, 0, err);
}

int mkv_cdump_put_attr_double(mkv_cdump_writer *w, int layer, int head, const char *name, double v, mkv_error *err)
{
    return put_attr(w, layer, head, name, ENTRY_ATTR_DOUBLE, 0, v, err);
}

uint64_t mkv_cdump_head_bytes(const mkv_cdump_writer *w, int layer, int head)
{
    if (check_head(w, layer, head, NULL))
        return 0;
    LOCK();
    uint64_t b = head_of(w, layer, head)->bytes;
    UNLOCK();
    return b;
}

uint64_t mkv_cdump_total_bytes(const mkv_cdump_writer *w)
{
    LOCK();
    uint64_t b = w->total;
    UNLOCK();
    return b;
}

void mkv_cdump_set_source_digest(mkv_cdump_writer *w, const char *digest)
{
    snprintf(w->meta.source_digest, sizeof w->meta.source_digest, "%s", digest);
}

/* Write what is pending and the byte accounting; the caller holds the lock. */
static int finalize(mkv_cdump_writer *w, mkv_error *err)
{
    const mkv_dump_meta *m = &w->meta.raw;
    int rc = flush_layers(w, m->n_layers, err);
    for (int l = w->first_layer; l < w->end_layer && !rc; l++)
        for (int h = 0; h < m->n_kv_heads && !rc; h++) {
            head_state *hs = head_of(w, l, h);
            char path[64];
            head_path(path, sizeof path, l, h, NULL);
            if (hs->n_names == 0) {
                rc = mkv_fail(err, MKV_EFORMAT, "%s: the method stored nothing for layer %d head %d", path, l, h);
                break;
            }
            hid_t hg = H5Gopen2(w->out.fid, path, H5P_DEFAULT);
            if (hg < 0)
                rc = mkv_fail(err, MKV_EIO, "cannot open group %s", path);
            else if ((rc = mkv_h5_attr_put_int(hg, "logical_bytes", (int64_t)head_logical_bytes(m), err)) ||
                     (rc = mkv_h5_attr_put_int(hg, "physical_bytes", (int64_t)hs->bytes, err)))
                mkv_error_prefix(err, "%s", path);
            if (hg >= 0)
                H5Gclose(hg);
        }
    if (!rc) {
        hid_t f = w->out.fid;
        w->meta.physical_bytes = w->total;
        if ((rc = mkv_h5_attr_put_int(f, "logical_bytes", (int64_t)w->meta.logical_bytes, err)) == MKV_OK &&
            (rc = mkv_h5_attr_put_int(f, "physical_bytes", (int64_t)w->total, err)) == MKV_OK)
            rc = mkv_h5_attr_put_double(f, "compression_ratio",
                                        (double)w->meta.logical_bytes / (double)w->total, err);
        if (!rc && w->meta.source_digest[0])
            rc = mkv_h5_attr_put_str(f, "source_digest", w->meta.source_digest, err);
    }
    return rc;
}

int mkv_cdump_commit(mkv_cdump_writer *w, mkv_error *err)
{
    LOCK();
    int rc = finalize(w, err);
    if (rc)
        mkv_h5_discard(&w->out);
    else
        rc = mkv_h5_finish(&w->out, err);
    UNLOCK();
    writer_free(w);
    return rc;
}

static int read_meta(mkv_cdump *c, mkv_error *err);
static int read_query_pos(mkv_cdump *c, mkv_error *err);
static int check_accounting(mkv_cdump *c, mkv_error *err);

int mkv_cdump_commit_open(mkv_cdump_writer *w, mkv_cdump **out, mkv_error *err)
{
    *out = NULL;
    mkv_cdump *c = calloc(1, sizeof *c);
    if (!c || !(c->path = strdup("(memory)"))) {
        free(c);
        mkv_cdump_abort(w);
        return mkv_fail(err, MKV_ENOMEM, "out of memory");
    }
    LOCK();
    int rc = finalize(w, err);
    if (!rc && H5Fflush(w->out.fid, H5F_SCOPE_GLOBAL) < 0)
        rc = mkv_fail(err, MKV_EIO, "cannot flush the in-memory compressed cache");
    if (rc) {
        mkv_h5_discard(&w->out);
        c->fid = H5I_INVALID_HID;
    } else {
        c->fid = w->out.fid;   /* the reader takes the file over */
        w->out.fid = H5I_INVALID_HID;
        if (!(rc = read_meta(c, err)) && !(rc = read_query_pos(c, err))) {
            c->first_layer = w->first_layer;
            c->end_layer = w->end_layer;
            rc = check_accounting(c, err);
        }
    }
    UNLOCK();
    writer_free(w);
    if (rc) {
        mkv_cdump_close(c);
        return rc;
    }
    *out = c;
    return MKV_OK;
}

void mkv_cdump_abort(mkv_cdump_writer *w)
{
    if (!w)
        return;
    LOCK();
    mkv_h5_discard(&w->out);
    UNLOCK();
    writer_free(w);
}

/* ================================================================ reader */


/* Sum of numel x element size per head, over every dataset under /layers. */
typedef struct {
    const mkv_dump_meta *m;
    int first_layer, end_layer;
    uint64_t *head_bytes;  /* [n_layers][n_kv_heads] */
    uint64_t total;
    char bad[256];         /* first object that has no place there */
} recount_ctx;

/* "NN/HH/..." -> layer and head; -1 if name is not below a head group. */
static int parse_head(const char *name, const mkv_dump_meta *m, int *layer, int *head)
{
    char *end;
    long l = strtol(name, &end, 10);
    if (end == name || *end != '/' || l < 0 || l >= m->n_layers)
        return -1;
    const char *rest = end + 1;
    long h = strtol(rest, &end, 10);
    if (end == rest || *end != '/' || h < 0 || h >= m->n_kv_heads)
        return -1;
    *layer = (int)l;
    *head = (int)h;
    return 0;
}

static herr_t recount_visit(hid_t layers, const char *name, const H5O_info_t *info, void *data)
{
    recount_ctx *ctx = data;
    if (info->type != H5O_TYPE_DATASET)
        return 0;
    int l, h;
    if (parse_head(name, ctx->m, &l, &h) || l < ctx->first_layer || l >= ctx->end_layer) {
        snprintf(ctx->bad, sizeof ctx->bad, "/layers/%s", name);
        return 1;
    }
    hid_t ds = H5Dopen2(layers, name, H5P_DEFAULT);
    hid_t space = ds >= 0 ? H5Dget_space(ds) : -1;
    hid_t type = ds >= 0 ? H5Dget_type(ds) : -1;
    hssize_t n = space >= 0 ? H5Sget_simple_extent_npoints(space) : -1;
    size_t size = type >= 0 ? H5Tget_size(type) : 0;
    if (type >= 0)
        H5Tclose(type);
    if (space >= 0)
        H5Sclose(space);
    if (ds >= 0)
        H5Dclose(ds);
    if (n < 0 || size == 0) {
        snprintf(ctx->bad, sizeof ctx->bad, "/layers/%s", name);
        return 1;
    }
    uint64_t b = (uint64_t)n * size;
    ctx->head_bytes[(size_t)l * (size_t)ctx->m->n_kv_heads + (size_t)h] += b;
    ctx->total += b;
    return 0;
}

/* The byte accounting is checked, not trusted: the attributes must equal
 * what the datasets really hold. */
static int check_accounting(mkv_cdump *c, mkv_error *err)
{
    const mkv_dump_meta *m = &c->meta.raw;
    size_t nh = (size_t)m->n_layers * (size_t)m->n_kv_heads;
    recount_ctx ctx = {m, c->first_layer, c->end_layer, calloc(nh, sizeof(uint64_t)), 0, ""};
    if (!ctx.head_bytes)
        return mkv_fail(err, MKV_ENOMEM, "out of memory");
    int rc = MKV_OK;
    for (int l = c->first_layer; l < c->end_layer && !rc; l++)
        for (int h = 0; h < m->n_kv_heads && !rc; h++) {
            char path[64];
            head_path(path, sizeof path, l, h, NULL);
            if (!mkv_h5_has_link(c->fid, path))
                rc = mkv_fail(err, MKV_EFORMAT, "'%s': missing group %s", c->path, path);
        }
    hid_t layers = rc ? -1 : H5Gopen2(c->fid, "/layers", H5P_DEFAULT);
    if (!rc && layers < 0)
        rc = mkv_fail(err, MKV_EFORMAT, "'%s': /layers is not a group", c->path);
    if (!rc) {
        herr_t v = H5Ovisit(layers, H5_INDEX_NAME, H5_ITER_INC, recount_visit, &ctx);
        if (v > 0)
            rc = mkv_fail(err, MKV_EFORMAT, "'%s': unexpected dataset %s (arrays belong to /layers/NN/HH)",
                          c->path, ctx.bad);
        else if (v < 0)
            rc = mkv_fail(err, MKV_EFORMAT, "'%s': cannot list the datasets under /layers", c->path);
    }
    for (int l = c->first_layer; l < c->end_layer && !rc; l++)
        for (int h = 0; h < m->n_kv_heads && !rc; h++) {
            char path[64];
            head_path(path, sizeof path, l, h, NULL);
            hid_t hg = H5Gopen2(c->fid, path, H5P_DEFAULT);
            int64_t phys = 0, logical = 0;
            uint64_t counted = ctx.head_bytes[(size_t)l * (size_t)m->n_kv_heads + (size_t)h];
            if (hg < 0)
                rc = mkv_fail(err, MKV_EFORMAT, "'%s': %s is not a group", c->path, path);
            else if ((rc = mkv_h5_attr_get_int(hg, "physical_bytes", &phys, err)) ||
                     (rc = mkv_h5_attr_get_int(hg, "logical_bytes", &logical, err)))
                mkv_error_prefix(err, "'%s': %s", c->path, path);
            else if ((uint64_t)phys != counted)
                rc = mkv_fail(err, MKV_EFORMAT,
                              "'%s': %s: physical_bytes says %" PRId64 " but its datasets hold %" PRIu64 " bytes",
                              c->path, path, phys, counted);
            else if ((uint64_t)logical != head_logical_bytes(m))
                rc = mkv_fail(err, MKV_EFORMAT, "'%s': %s: logical_bytes says %" PRId64 ", expected %" PRIu64
                              " (2 x n_tokens x head_dim x 2)", c->path, path, logical, head_logical_bytes(m));
            if (hg >= 0)
                H5Gclose(hg);
        }
    if (layers >= 0)
        H5Gclose(layers);
    free(ctx.head_bytes);
    if (rc)
        return rc;
    uint64_t logical = (uint64_t)(c->end_layer - c->first_layer) * (uint64_t)m->n_kv_heads * head_logical_bytes(m);
    if (c->meta.physical_bytes != ctx.total)
        return mkv_fail(err, MKV_EFORMAT, "'%s': physical_bytes says %" PRIu64 " but /layers holds %" PRIu64 " bytes",
                        c->path, c->meta.physical_bytes, ctx.total);
    if (c->meta.logical_bytes != logical)
        return mkv_fail(err, MKV_EFORMAT,
                        "'%s': logical_bytes says %" PRIu64 ", expected %" PRIu64
                        " (n_layers x n_kv_heads x 2 x n_tokens x head_dim x 2)",
                        c->path, c->meta.logical_bytes, logical);
    if (ctx.total == 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s': /layers holds no data", c->path);
    return MKV_OK;
}

static int read_query_pos(mkv_cdump *c, mkv_error *err)
{
    const char *name = "/query_pos";
    if (!mkv_h5_has_link(c->fid, name))
        return mkv_fail(err, MKV_EFORMAT, "'%s': missing dataset %s", c->path, name);
    hid_t ds = H5Dopen2(c->fid, name, H5P_DEFAULT);
    if (ds < 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s': %s is not a dataset", c->path, name);
    hsize_t dims[3];
    int rank = mkv_dump_dset_dims(ds, dims);
    hid_t t = H5Dget_type(ds);
    H5T_class_t cls = t >= 0 ? H5Tget_class(t) : H5T_NO_CLASS;
    if (t >= 0)
        H5Tclose(t);
    int rc = MKV_OK;
    if (cls != H5T_INTEGER || rank != 1)
        rc = mkv_fail(err, MKV_EFORMAT, "'%s': %s is not a one-dimensional integer dataset", c->path, name);
    else if (dims[0] > (hsize_t)c->meta.raw.n_tokens)
        rc = mkv_fail(err, MKV_EFORMAT, "'%s': %s has %llu queries for %" PRId64 " tokens", c->path, name,
                      (unsigned long long)dims[0], c->meta.raw.n_tokens);
    if (!rc) {
        c->meta.raw.n_queries = (int64_t)dims[0];
        c->query_pos = malloc(sizeof(int32_t) * (dims[0] ? dims[0] : 1));
        if (!c->query_pos)
            rc = mkv_fail(err, MKV_ENOMEM, "out of memory");
        else if (dims[0] && mkv_h5_dread(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, c->query_pos) < 0)
            rc = mkv_fail(err, MKV_EFORMAT, "'%s': cannot read %s", c->path, name);
    }
    H5Dclose(ds);
    for (hsize_t i = 0; !rc && i < dims[0]; i++)
        if (c->query_pos[i] < 0 || c->query_pos[i] >= c->meta.raw.n_tokens)
            rc = mkv_fail(err, MKV_EFORMAT, "'%s': %s: position %d at index %llu is outside 0..%" PRId64,
                          c->path, name, c->query_pos[i], (unsigned long long)i, c->meta.raw.n_tokens - 1);
    return rc;
}

static int read_meta(mkv_cdump *c, mkv_error *err)
{
    hid_t f = c->fid;
    mkv_cdump_meta *cm = &c->meta;
    mkv_dump_meta *m = &cm->raw;
    char fmt[64];
    int64_t v;
    mkv_dump_meta_init(m);
    if (!mkv_h5_has_attr(f, "mkv_format"))
        return mkv_fail(err, MKV_EFORMAT, "'%s' is not a mosaickv dump (no mkv_format attribute)", c->path);
    if (mkv_h5_attr_get_str(f, "mkv_format", fmt, sizeof fmt, err))
        return mkv_error_prefix(err, "'%s'", c->path);
    if (strcmp(fmt, MKV_DUMP_FORMAT) == 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s' is a raw KV dump; %s needs a compressed dump (mkv-compress)",
                        c->path, mkv_progname());
    if (strcmp(fmt, MKV_CDUMP_FORMAT) != 0)
        return mkv_fail(err, MKV_EFORMAT,
                        "'%s' is not a compressed KV dump (mkv_format is '%s', expected '%s')",
                        c->path, fmt, MKV_CDUMP_FORMAT);
    if (mkv_h5_attr_get_int(f, "mkv_version", &v, err))
        return mkv_error_prefix(err, "'%s'", c->path);
    if (v != MKV_CDUMP_VERSION)
        return mkv_fail(err, MKV_EFORMAT, "'%s': unsupported mkv_version %" PRId64 " (this build reads version %d)",
                        c->path, v, MKV_CDUMP_VERSION);
    int rc = mkv_dump_read_model_attrs(f, c->path, m, err);
    if (rc != MKV_OK)
        return rc;
    int64_t logical, physical;
    if (mkv_h5_attr_get_int(f, "n_tokens", &m->n_tokens, err) ||
        mkv_h5_attr_get_int(f, "logical_bytes", &logical, err) ||
        mkv_h5_attr_get_int(f, "physical_bytes", &physical, err) ||
        mkv_h5_attr_get_str(f, "method", cm->method, sizeof cm->method, err) ||
        mkv_h5_attr_get_str(f, "params", cm->params, sizeof cm->params, err) ||
        mkv_h5_attr_get_str(f, "source", cm->source, sizeof cm->source, err))
        return mkv_error_prefix(err, "'%s'", c->path);
    if (logical < 0 || physical < 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s': negative byte counts", c->path);
    cm->logical_bytes = (uint64_t)logical;
    cm->physical_bytes = (uint64_t)physical;
    /* source_digest and raw_source are ours, not part of the required layout */
    if (mkv_h5_has_attr(f, "source_digest") &&
        mkv_h5_attr_get_str(f, "source_digest", cm->source_digest, sizeof cm->source_digest, err))
        return mkv_error_prefix(err, "'%s'", c->path);
    if (mkv_h5_has_attr(f, "raw_source") &&
        mkv_h5_attr_get_str(f, "raw_source", m->source, sizeof m->source, err))
        return mkv_error_prefix(err, "'%s'", c->path);
    if (!mkv_h5_has_attr(f, "raw_source"))
        strcpy(m->source, "import");
    if (mkv_dump_meta_check(m, err))
        return mkv_error_prefix(err, "'%s'", c->path);
    if (!cm->method[0])
        return mkv_fail(err, MKV_EFORMAT, "'%s': empty method attribute", c->path);
    return MKV_OK;
}

/* mkv_cdump_open_fid, called locked. */
static int open_fid(hid_t fid, const char *path, mkv_cdump **out, mkv_error *err)
{
    *out = NULL;
    mkv_cdump *c = calloc(1, sizeof *c);
    if (!c || !(c->path = strdup(strcmp(path, "-") == 0 ? "(stdin)" : path))) {
        free(c);
        H5Fclose(fid);
        return mkv_fail(err, MKV_ENOMEM, "out of memory");
    }
    c->fid = fid;
    int rc = read_meta(c, err);
    if (!rc)
        rc = read_query_pos(c, err);
    if (!rc) {
        c->end_layer = c->meta.raw.n_layers;
        rc = check_accounting(c, err);
    }
    if (rc) {
        /* mkv_cdump_close would take the lock held here */
        H5Fclose(c->fid);
        free(c->query_pos);
        free(c->path);
        free(c);
        return rc;
    }
    *out = c;
    return MKV_OK;
}

int mkv_cdump_open(const char *path, mkv_cdump **out, mkv_error *err)
{
    *out = NULL;
    hid_t fid;
    LOCK();
    int rc = mkv_h5_open_read(path, &fid, err);
    if (!rc)
        rc = open_fid(fid, path, out, err);
    UNLOCK();
    return rc;
}

int mkv_cdump_open_fid(hid_t fid, const char *path, mkv_cdump **out, mkv_error *err)
{
    LOCK();
    int rc = open_fid(fid, path, out, err);
    UNLOCK();
    return rc;
}

const mkv_cdump_meta *mkv_cdump_meta_of(const mkv_cdump *c) { return &c->meta; }

const char *mkv_cdump_param(const mkv_cdump *c, const char *key, char *buf, size_t size)
{
    size_t klen = strlen(key);
    for (const char *p = c->meta.params; *p;) {
        p += strspn(p, " ");
        size_t len = strcspn(p, " ");
        if (len > klen && strncmp(p, key, klen) == 0 && p[klen] == '=') {
            snprintf(buf, size, "%.*s", (int)(len - klen - 1), p + klen + 1);
            return buf;
        }
        p += len;
    }
    return NULL;
}

/* Open /layers/NN/HH/name, or fail naming it. Called locked. */
static hid_t open_array(mkv_cdump *c, int layer, int head, const char *name, char *path, size_t size, mkv_error *err)
{
    head_path(path, size, layer, head, name);
    const mkv_dump_meta *m = &c->meta.raw;
    if (layer < c->first_layer || layer >= c->end_layer || head < 0 || head >= m->n_kv_heads) {
        mkv_fail(err, MKV_EUSAGE, "'%s': layer %d head %d is outside the dump", c->path, layer, head);
        return -1;
    }
    if (!mkv_h5_has_link(c->fid, path)) {
        mkv_fail(err, MKV_EFORMAT, "'%s': missing dataset %s", c->path, path);
        return -1;
    }
    hid_t ds = H5Dopen2(c->fid, path, H5P_DEFAULT);
    if (ds < 0)
        mkv_fail(err, MKV_EFORMAT, "'%s': %s is not a dataset", c->path, path);
    return ds;
}

int mkv_cdump_shape(mkv_cdump *c, int layer, int head, const char *name, int64_t dims[3])
{
    char path[128];
    head_path(path, sizeof path, layer, head, name);
    LOCK();
    int rank = 0;
    if (mkv_h5_has_link(c->fid, path)) {
        hid_t ds = open_array(c, layer, head, name, path, sizeof path, NULL);
        hsize_t d[3] = {0, 0, 0};
        rank = ds >= 0 ? mkv_dump_dset_dims(ds, d) : 0;
        if (rank < 0)
            rank = 0;
        for (int i = 0; i < 3; i++)
            dims[i] = i < rank ? (int64_t)d[i] : 0;
        if (ds >= 0)
            H5Dclose(ds);
    }
    UNLOCK();
    return rank;
}

/* Does the stored type match t? If not, describe the stored type. */
static int type_matches(hid_t ft, mkv_el_type t, char *desc, size_t size)
{
    H5T_class_t cls = H5Tget_class(ft);
    size_t bytes = H5Tget_size(ft);
    if (cls == H5T_FLOAT) {
        size_t spos, epos, esize, mpos, msize;
        int half = bytes == 2 && H5Tget_fields(ft, &spos, &epos, &esize, &mpos, &msize) >= 0 &&
                   esize == 5 && msize == 10;
        snprintf(desc, size, bytes == 2 && !half ? "a 16-bit float other than IEEE binary16" : "float%zu", bytes * 8);
        return ((t == MKV_EL_F16 || t == MKV_EL_F16_BITS) && half) || ((t == MKV_EL_F32 || t == MKV_EL_F32_OR_NAN) && bytes == 4);
    }
    if (cls == H5T_INTEGER) {
        int is_signed = H5Tget_sign(ft) == H5T_SGN_2;
        snprintf(desc, size, "%sint%zu", is_signed ? "" : "u", bytes * 8);
        return (t == MKV_EL_U8 && bytes == 1 && !is_signed) || (t == MKV_EL_I16 && bytes == 2 && is_signed) ||
               (t == MKV_EL_I32 && bytes == 4 && is_signed);
    }
    snprintf(desc, size, "not numeric");
    return 0;
}

int mkv_cdump_get(mkv_cdump *c, int layer, int head, const char *name, mkv_el_type type,
                  void *out, size_t numel, mkv_error *err)
{
    char path[128], desc[64];
    mkv_error local;
    if (!err)
        err = &local;
    if (mkv_el_size(type) == 0)
        return mkv_fail(err, MKV_EUSAGE, "unknown element type %d", (int)type);
    LOCK();
    hid_t ds = open_array(c, layer, head, name, path, sizeof path, err);
    if (ds < 0) {
        UNLOCK();
        return err->code;
    }
    int rc = MKV_OK;
    hid_t ft = H5Dget_type(ds);
    hid_t space = H5Dget_space(ds);
    hssize_t n = space >= 0 ? H5Sget_simple_extent_npoints(space) : -1;
    void *raw = NULL;
    if (ft < 0 || n < 0) {
        rc = mkv_fail(err, MKV_EFORMAT, "'%s': cannot read %s", c->path, path);
    } else if (!type_matches(ft, type, desc, sizeof desc)) {
        rc = mkv_fail(err, MKV_EFORMAT, "'%s': %s is %s, expected %s", c->path, path, desc, el_name(type));
    } else if ((size_t)n != numel) {
        rc = mkv_fail(err, MKV_EFORMAT, "'%s': %s has %lld elements, expected %zu", c->path, path, (long long)n, numel);
    } else if (numel > 0) {
        int half = type == MKV_EL_F16 || type == MKV_EL_F16_BITS;
        hid_t mt = half ? mkv_h5_f16_type() : -1;
        void *dst = out;
        if (type == MKV_EL_F16)
            dst = raw = mkv_alloc(numel, 2, "read buffer", err);
        if (half && mt < 0)
            rc = mkv_fail(err, MKV_EIO, "cannot make the HDF5 float16 type");
        else if (!dst)
            rc = MKV_ENOMEM;
        else if (mkv_h5_dread(ds, half ? mt : mem_type(type, -1), H5S_ALL, H5S_ALL, dst) < 0)
            rc = mkv_fail(err, MKV_EFORMAT, "'%s': %s: read failed (damaged data?)", c->path, path);
        if (mt >= 0)
            H5Tclose(mt);
    }
    if (space >= 0)
        H5Sclose(space);
    if (ft >= 0)
        H5Tclose(ft);
    H5Dclose(ds);
    UNLOCK();
    if (!rc && raw)
        mkv_f16_to_f32_n(raw, out, numel);
    mkv_free(raw);
    if (!rc && type == MKV_EL_F32_OR_NAN) {
        for (size_t i = 0; i < numel && !rc; i++)
            if (isinf(((const float *)out)[i]))
                rc = mkv_fail(err, MKV_EFORMAT, "'%s': %s: %s at index %zu", c->path, path,
                              ((const float *)out)[i] < 0 ? "-Inf" : "Inf", i);
    }
    if (!rc && type == MKV_EL_F16_BITS) {
        int64_t bad = find_nonfinite_f16(out, numel);
        if (bad >= 0)
            rc = mkv_fail(err, MKV_EFORMAT, "'%s': %s: %s at index %" PRId64, c->path, path,
                          f16_nonfinite_name(((const uint16_t *)out)[bad]), bad);
    }
    if (!rc && (type == MKV_EL_F16 || type == MKV_EL_F32)) {
        int64_t bad = mkv_find_nonfinite(out, numel);
        if (bad >= 0) {
            float x = ((const float *)out)[bad];
            rc = mkv_fail(err, MKV_EFORMAT, "'%s': %s: %s at index %" PRId64, c->path, path,
                          x != x ? "NaN" : x < 0 ? "-Inf" : "Inf", bad);
        }
    }
    return rc;
}

int mkv_cdump_get_alloc(mkv_cdump *c, int layer, int head, const char *name, mkv_el_type type,
                        void **out, size_t *numel, mkv_error *err)
{
    *out = NULL;
    *numel = 0;
    mkv_error local;
    if (!err)
        err = &local;
    int64_t dims[3];
    char path[128];
    int rank = mkv_cdump_shape(c, layer, head, name, dims);
    if (rank == 0) {
        LOCK();
        hid_t ds = open_array(c, layer, head, name, path, sizeof path, err);
        if (ds >= 0) {
            H5Dclose(ds);
            mkv_fail(err, MKV_EFORMAT, "'%s': %s has rank 0 or more than 3", c->path, path);
        }
        UNLOCK();
        return err->code;
    }
    size_t n = 1;
    for (int i = 0; i < rank && i < 3; i++)
        if (mkv_mul_size(n, (size_t)dims[i], &n))
            return mkv_fail(err, MKV_ENOMEM, "'%s': array '%s' is too large", c->path, name);
    void *buf = mkv_alloc(n ? n : 1, mem_size(type) ? mem_size(type) : 1, name, err);
    if (!buf)
        return MKV_ENOMEM;
    int rc = mkv_cdump_get(c, layer, head, name, type, buf, n, err);
    if (rc) {
        mkv_free(buf);
        return rc;
    }
    *out = buf;
    *numel = n;
    return MKV_OK;
}

static int get_head_attr(mkv_cdump *c, int layer, int head, const char *name, int is_int, void *v, mkv_error *err)
{
    const mkv_dump_meta *m = &c->meta.raw;
    if (layer < c->first_layer || layer >= c->end_layer || head < 0 || head >= m->n_kv_heads)
        return mkv_fail(err, MKV_EUSAGE, "'%s': layer %d head %d is outside the dump", c->path, layer, head);
    char path[64];
    head_path(path, sizeof path, layer, head, NULL);
    LOCK();
    hid_t hg = H5Gopen2(c->fid, path, H5P_DEFAULT);
    int rc;
    if (hg < 0)
        rc = mkv_fail(err, MKV_EFORMAT, "'%s': cannot open group %s", c->path, path);
    else if ((rc = is_int ? mkv_h5_attr_get_int(hg, name, v, err) : mkv_h5_attr_get_double(hg, name, v, err)))
        mkv_error_prefix(err, "'%s': %s", c->path, path);
    if (hg >= 0)
        H5Gclose(hg);
    UNLOCK();
    return rc;
}

int mkv_cdump_get_attr_int(mkv_cdump *c, int layer, int head, const char *name, int64_t *v, mkv_error *err)
{
    return get_head_attr(c, layer, head, name, 1, v, err);
}

int mkv_cdump_get_attr_double(mkv_cdump *c, int layer, int head, const char *name, double *v, mkv_error *err)
{
    return get_head_attr(c, layer, head, name, 0, v, err);
}

int mkv_cdump_read_query_pos(mkv_cdump *c, int32_t *out, mkv_error *err)
{
    (void)err;
    memcpy(out, c->query_pos, sizeof(int32_t) * (size_t)c->meta.raw.n_queries);
    return MKV_OK;
}

const char *mkv_cdump_path(const mkv_cdump *c) { return c->path; }

/* ---------------------------------------------------------------- arrays of a known shape */

int mkv_cdump_has(mkv_cdump *c, int layer, int head, const char *name)
{
    int64_t dims[3];
    return mkv_cdump_shape(c, layer, head, name, dims) > 0;
}

int mkv_cdump_get_shaped(mkv_cdump *c, int layer, int head, const char *name, mkv_el_type type, int rank,
                         const int64_t *dims, void **out, mkv_error *err)
{
    int64_t have[3] = {0, 0, 0};
    int r = mkv_cdump_shape(c, layer, head, name, have);
    int same = r == rank;
    for (int i = 0; same && i < rank; i++)
        same = have[i] == dims[i];
    if (!same) {
        char want[96] = "", got[96] = "";
        for (int i = 0; i < rank; i++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? " x " : "",
                     (long long)dims[i]);
        for (int i = 0; i < r && i < 3; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? " x " : "",
                     (long long)have[i]);
        return mkv_fail(err, MKV_EFORMAT, "layer %d, KV head %d: array '%s' is %s, expected [%s]",
                        layer, head, name, r > 0 ? got : "missing", want);
    }
    size_t numel = 1;
    for (int i = 0; i < rank; i++)
        numel *= (size_t)dims[i];
    size_t el = mem_size(type);
    void *buf = mkv_alloc(numel ? numel : 1, el, name, err);
    if (!buf)
        return MKV_ENOMEM;
    int rc = mkv_cdump_get(c, layer, head, name, type, buf, numel, err);
    if (rc != MKV_OK) {
        mkv_free(buf);
        return rc;
    }
    *out = buf;
    return MKV_OK;
}

int mkv_cdump_put_rows(mkv_cdump_writer *w, int layer, int head, const char *name, mkv_el_type type,
                       int64_t rows, int64_t cols, const void *data, mkv_error *err)
{
    if (rows <= 0)
        return MKV_OK;
    int64_t dims[2] = {rows, cols};
    return mkv_cdump_put(w, layer, head, name, type, 2, dims, data, err);
}

void mkv_cdump_cache_shape(mkv_cdump *c, int64_t *T, int *d, int *G)
{
    const mkv_cdump_meta *m = mkv_cdump_meta_of(c);
    *T = m->raw.n_tokens;
    *d = m->raw.head_dim;
    *G = m->raw.n_kv_heads > 0 ? m->raw.n_heads / m->raw.n_kv_heads : 1;
}

void mkv_cdump_close(mkv_cdump *c)
{
    if (!c)
        return;
    LOCK();
    if (c->fid >= 0)
        H5Fclose(c->fid);
    UNLOCK();
    free(c->query_pos);
    free(c->path);
    free(c);
}
