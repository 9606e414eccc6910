/* GGUF reader: header, metadata, tensor directory and their checks. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/gguf.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader reads little-endian values directly"
#endif

#define GGUF_MAGIC "GGUF"
/* Limits of the specification: keys at most 65535 bytes; ggml's tensor
 * types need at most 4 dimensions. */
#define MAX_KEY_LEN 65535
#define MAX_NAME_LEN 65535

/* ------------------------------------------------------------ ggml types */

typedef struct {
    const char *name;
    uint32_t block, size; /* elements and bytes per block; 0: no such type */
} ggml_type_info;

/* ggml's type ids (gaps are ids ggml has retired). */
static const ggml_type_info GGML_TYPES[] = {
    [0] = {"F32", 1, 4},        [1] = {"F16", 1, 2},       [2] = {"Q4_0", 32, 18},
    [3] = {"Q4_1", 32, 20},     [6] = {"Q5_0", 32, 22},    [7] = {"Q5_1", 32, 24},
    [8] = {"Q8_0", 32, 34},     [9] = {"Q8_1", 32, 36},    [10] = {"Q2_K", 256, 84},
    [11] = {"Q3_K", 256, 110},  [12] = {"Q4_K", 256, 144}, [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210},  [15] = {"Q8_K", 256, 292}, [16] = {"IQ2_XXS", 256, 66},
    [17] = {"IQ2_XS", 256, 74}, [18] = {"IQ3_XXS", 256, 98}, [19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", 32, 18},  [21] = {"IQ3_S", 256, 110}, [22] = {"IQ2_S", 256, 82},
    [23] = {"IQ4_XS", 256, 136}, [24] = {"I8", 1, 1},      [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},       [27] = {"I64", 1, 8},      [28] = {"F64", 1, 8},
    [29] = {"IQ1_M", 256, 56},  [30] = {"BF16", 1, 2},     [34] = {"TQ1_0", 256, 54},
    [35] = {"TQ2_0", 256, 66},  [39] = {"MXFP4", 32, 17},  [40] = {"NVFP4", 64, 36},
    [41] = {"Q1_0", 128, 18},   [42] = {"Q2_0", 64, 18},
};

#define N_GGML_TYPES (sizeof GGML_TYPES / sizeof GGML_TYPES[0])

const char *mkv_ggml_type_name(uint32_t type)
{
    return type < N_GGML_TYPES ? GGML_TYPES[type].name : NULL;
}

uint32_t mkv_ggml_block_size(uint32_t type)
{
    return type < N_GGML_TYPES ? GGML_TYPES[type].block : 0;
}

uint32_t mkv_ggml_type_size(uint32_t type)
{
    return type < N_GGML_TYPES ? GGML_TYPES[type].size : 0;
}
static uint16_t get_u16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* ------------------------------------------------------------ file structure */

typedef struct arena_block {
    struct arena_block *next;
    size_t used, cap;
    max_align_t data[];
} arena_block;

struct mkv_gguf {
    char *path;
    unsigned char *map;
    size_t size;
    uint32_t version, alignment;
    uint64_t data_offset;
    uint64_t n_kv;
    const char **keys;
    mkv_gguf_value *values;
    uint64_t *kv_by_key;        /* indices sorted by key */
    uint64_t n_tensors;
    mkv_gguf_tensor *tensors;
    uint64_t *tensor_by_name;   /* indices sorted by name */
    arena_block *arena;
};

#define ARENA_CHUNK ((size_t)1 << 20)

/* Storage that lives as long as the file: strings and array items. */
static void *arena_alloc(mkv_gguf *g, size_t n)
{
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    arena_block *b = g->arena;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > ARENA_CHUNK ? n : ARENA_CHUNK;
        b = malloc(sizeof *b + cap);
        if (!b)
            return NULL;
        b->cap = cap;
        b->used = 0;
        b->next = g->arena;
        g->arena = b;
    }
    void *p = (char *)b->data + b->used;
    b->used += n;
    return p;
}

typedef struct {
    mkv_gguf *g;
    uint64_t pos;
    mkv_error *err;
} parser;

static uint64_t left(const parser *ps) { return ps->g->size - ps->pos; }

/* Fail unless n more bytes are in the file; `what` says what is read. */
static int need(parser *ps, uint64_t n, const char *what)
{
    if (n > left(ps))
        return mkv_fail(ps->err, MKV_EFORMAT,
                        "'%s': truncated: %s needs %llu bytes at offset %llu, the file has %llu left",
                        ps->g->path, what, (unsigned long long)n, (unsigned long long)ps->pos,
                        (unsigned long long)left(ps));
    return MKV_OK;
}

static int read_u32(parser *ps, uint32_t *v, const char *what)
{
    int rc = need(ps, 4, what);
    if (rc)
        return rc;
    memcpy(v, ps->g->map + ps->pos, 4);
    ps->pos += 4;
    return MKV_OK;
}

static int read_u64(parser *ps, uint64_t *v, const char *what)
{
    int rc = need(ps, 8, what);
    if (rc)
        return rc;
    memcpy(v, ps->g->map + ps->pos, 8);
    ps->pos += 8;
    return MKV_OK;
}

/* A string, copied NUL-terminated into the arena. */
static int read_string(parser *ps, uint64_t max_len, const char **s, uint64_t *len,
                       const char *what)
{
    int rc = read_u64(ps, len, what);
    if (rc)
        return rc;
    if (*len > max_len)
        return mkv_fail(ps->err, MKV_EFORMAT, "'%s': %s: length %llu exceeds the limit of %llu",
                        ps->g->path, what, (unsigned long long)*len, (unsigned long long)max_len);
    if ((rc = need(ps, *len, what)))
        return rc;
    char *copy = arena_alloc(ps->g, (size_t)*len + 1);
    if (!copy)
        return mkv_fail(ps->err, MKV_ENOMEM, "'%s': out of memory reading %s", ps->g->path, what);
    memcpy(copy, ps->g->map + ps->pos, (size_t)*len);
    copy[*len] = '\0';
    ps->pos += *len;
    *s = copy;
    return MKV_OK;
}

/* Bytes of a scalar value type; 0 for string, array and unknown types. */
static uint64_t scalar_size(uint32_t t)
{
    switch (t) {
    case MKV_GGUF_UINT8: case MKV_GGUF_INT8: case MKV_GGUF_BOOL: return 1;
    case MKV_GGUF_UINT16: case MKV_GGUF_INT16: return 2;
    case MKV_GGUF_UINT32: case MKV_GGUF_INT32: case MKV_GGUF_FLOAT32: return 4;
    case MKV_GGUF_UINT64: case MKV_GGUF_INT64: case MKV_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

const char *mkv_gguf_type_name(mkv_gguf_type t)
{
    static const char *const names[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32",
                                        "float32", "bool", "string", "array", "uint64", "int64",
                                        "float64"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

/* Decode one little-endian scalar of type t at p. */
static void decode_scalar(uint32_t t, const unsigned char *p, mkv_gguf_value *v)
{
    v->type = (mkv_gguf_type)t;
    switch (t) {
    case MKV_GGUF_UINT8: case MKV_GGUF_BOOL: v->v.u = p[0]; break;
    case MKV_GGUF_INT8: v->v.i = (int8_t)p[0]; break;
    case MKV_GGUF_UINT16: v->v.u = get_u16(p); break;
    case MKV_GGUF_INT16: v->v.i = (int16_t)get_u16(p); break;
    case MKV_GGUF_UINT32: { uint32_t x; memcpy(&x, p, 4); v->v.u = x; break; }
    case MKV_GGUF_INT32: { int32_t x; memcpy(&x, p, 4); v->v.i = x; break; }
    case MKV_GGUF_FLOAT32: { float x; memcpy(&x, p, 4); v->v.f = x; break; }
    case MKV_GGUF_UINT64: memcpy(&v->v.u, p, 8); break;
    case MKV_GGUF_INT64: memcpy(&v->v.i, p, 8); break;
    case MKV_GGUF_FLOAT64: memcpy(&v->v.f, p, 8); break;
    }
}

static int read_value(parser *ps, uint32_t type, mkv_gguf_value *out, int depth, const char *key)
{
    mkv_gguf *g = ps->g;
    char what[160];
    snprintf(what, sizeof what, "the value of '%.100s'", key);
    memset(out, 0, sizeof *out);
    out->type = (mkv_gguf_type)type;
    uint64_t size = scalar_size(type);
    int rc;
    if (size) {
        if ((rc = need(ps, size, what)))
            return rc;
        decode_scalar(type, g->map + ps->pos, out);
        if (type == MKV_GGUF_BOOL && out->v.u > 1)
            return mkv_fail(ps->err, MKV_EFORMAT, "'%s': '%s': bool value %llu is neither 0 nor 1",
                            g->path, key, (unsigned long long)out->v.u);
        ps->pos += size;
        return MKV_OK;
    }
    if (type == MKV_GGUF_STRING)
        return read_string(ps, UINT64_MAX, &out->v.s, &out->n, what);
    if (type != MKV_GGUF_ARRAY)
        return mkv_fail(ps->err, MKV_EFORMAT, "'%s': '%s' has unknown value type %u", g->path, key,
                        (unsigned)type);
    if (depth >= MKV_GGUF_MAX_DEPTH)
        return mkv_fail(ps->err, MKV_EFORMAT, "'%s': '%s': arrays nested deeper than %d levels",
                        g->path, key, MKV_GGUF_MAX_DEPTH);
    uint32_t elem;
    uint64_t n;
    if ((rc = read_u32(ps, &elem, what)) || (rc = read_u64(ps, &n, what)))
        return rc;
    if (elem > MKV_GGUF_FLOAT64)
        return mkv_fail(ps->err, MKV_EFORMAT, "'%s': '%s': array of unknown value type %u", g->path,
                        key, (unsigned)elem);
    out->elem_type = (mkv_gguf_type)elem;
    out->n = n;
    /* Every element takes at least this many bytes, which bounds the count
     * before anything is allocated. */
    uint64_t min_size = scalar_size(elem) ? scalar_size(elem) : elem == MKV_GGUF_STRING ? 8 : 12;
    if (n > left(ps) / min_size)
        return mkv_fail(ps->err, MKV_EFORMAT,
                        "'%s': '%s': array of %llu %s elements cannot fit in the %llu bytes left",
                        g->path, key, (unsigned long long)n, mkv_gguf_type_name(elem),
                        (unsigned long long)left(ps));
    if (scalar_size(elem)) {
        out->v.raw = g->map + ps->pos;
        ps->pos += n * min_size;
        return MKV_OK;
    }
    mkv_gguf_value *items = n ? arena_alloc(g, (size_t)n * sizeof *items) : NULL;
    if (n && !items)
        return mkv_fail(ps->err, MKV_ENOMEM, "'%s': out of memory reading '%s'", g->path, key);
    for (uint64_t i = 0; i < n; i++)
        if ((rc = read_value(ps, elem, &items[i], depth + 1, key)))
            return rc;
    out->v.items = items;
    return MKV_OK;
}

/* qsort has no context argument; the comparators see the file here. */
static _Thread_local const mkv_gguf *sort_file;

static int by_key(const void *a, const void *b)
{
    return strcmp(sort_file->keys[*(const uint64_t *)a], sort_file->keys[*(const uint64_t *)b]);
}

static int by_tensor_name(const void *a, const void *b)
{
    return strcmp(sort_file->tensors[*(const uint64_t *)a].name,
                  sort_file->tensors[*(const uint64_t *)b].name);
}

static int by_tensor_offset(const void *a, const void *b)
{
    uint64_t x = sort_file->tensors[*(const uint64_t *)a].offset;
    uint64_t y = sort_file->tensors[*(const uint64_t *)b].offset;
    return (x > y) - (x < y);
}

static uint64_t *sorted_indices(const mkv_gguf *g, uint64_t n, int (*cmp)(const void *, const void *))
{
    uint64_t *idx = malloc((n ? n : 1) * sizeof *idx);
    if (!idx)
        return NULL;
    for (uint64_t i = 0; i < n; i++)
        idx[i] = i;
    sort_file = g;
    qsort(idx, (size_t)n, sizeof *idx, cmp);
    sort_file = NULL;
    return idx;
}

static int parse_metadata(parser *ps)
{
    mkv_gguf *g = ps->g;
    int rc;
    g->keys = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->keys);
    g->values = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->values);
    if (!g->keys || !g->values)
        return mkv_fail(ps->err, MKV_ENOMEM, "'%s': out of memory for %llu metadata entries",
                        g->path, (unsigned long long)g->n_kv);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        char what[64];
        snprintf(what, sizeof what, "metadata key %llu", (unsigned long long)i);
        uint64_t len;
        uint32_t type;
        if ((rc = read_string(ps, MAX_KEY_LEN, &g->keys[i], &len, what)))
            return rc;
        if (len == 0 || strlen(g->keys[i]) != len)
            return mkv_fail(ps->err, MKV_EFORMAT, "'%s': %s is empty or contains a NUL byte",
                            g->path, what);
        if ((rc = read_u32(ps, &type, what)) ||
            (rc = read_value(ps, type, &g->values[i], 0, g->keys[i])))
            return rc;
    }
    if (!(g->kv_by_key = sorted_indices(g, g->n_kv, by_key)))
        return mkv_fail(ps->err, MKV_ENOMEM, "'%s': out of memory", g->path);
    for (uint64_t i = 1; i < g->n_kv; i++)
        if (strcmp(g->keys[g->kv_by_key[i - 1]], g->keys[g->kv_by_key[i]]) == 0)
            return mkv_fail(ps->err, MKV_EFORMAT, "'%s': metadata key '%.100s' appears twice",
                            g->path, g->keys[g->kv_by_key[i]]);
    g->alignment = MKV_GGUF_DEFAULT_ALIGNMENT;
    const mkv_gguf_value *a = mkv_gguf_find(g, "general.alignment");
    if (a) {
        int64_t v;
        if (mkv_gguf_value_int(a, &v) != 0 || v < 1 || v > (1 << 30) || (v & (v - 1)) != 0)
            return mkv_fail(ps->err, MKV_EFORMAT,
                            "'%s': general.alignment must be a power of two (an integer up to 2^30)",
                            g->path);
        g->alignment = (uint32_t)v;
    }
    return MKV_OK;
}

static int parse_tensor_infos(parser *ps)
{
    mkv_gguf *g = ps->g;
    int rc;
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    if (!g->tensors)
        return mkv_fail(ps->err, MKV_ENOMEM, "'%s': out of memory for %llu tensors", g->path,
                        (unsigned long long)g->n_tensors);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        mkv_gguf_tensor *t = &g->tensors[i];
        char what[64];
        snprintf(what, sizeof what, "tensor info %llu", (unsigned long long)i);
        uint64_t len;
        if ((rc = read_string(ps, MAX_NAME_LEN, &t->name, &len, what)))
            return rc;
        if (len == 0 || strlen(t->name) != len)
            return mkv_fail(ps->err, MKV_EFORMAT, "'%s': the name of %s is empty or contains a NUL "
                            "byte", g->path, what);
        if ((rc = read_u32(ps, &t->n_dims, what)))
            return rc;
        if (t->n_dims < 1 || t->n_dims > MKV_GGUF_MAX_DIMS)
            return mkv_fail(ps->err, MKV_EFORMAT, "'%s': tensor '%.100s' has %u dimensions (1 to %d "
                            "allowed)", g->path, t->name, (unsigned)t->n_dims, MKV_GGUF_MAX_DIMS);
        for (int d = 0; d < MKV_GGUF_MAX_DIMS; d++)
            t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++)
            if ((rc = read_u64(ps, &t->ne[d], what)))
                return rc;
        if ((rc = read_u32(ps, &t->type, what)) || (rc = read_u64(ps, &t->offset, what)))
            return rc;
    }
    return MKV_OK;
}

/* Types, sizes, offsets and overlaps of the tensors, once the data start
 * is known; offsets become absolute. */
static int check_tensors(parser *ps)
{
    mkv_gguf *g = ps->g;
    uint64_t data_size = g->size > g->data_offset ? g->size - g->data_offset : 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        mkv_gguf_tensor *t = &g->tensors[i];
        uint32_t block = mkv_ggml_block_size(t->type), size = mkv_ggml_type_size(t->type);
        if (block == 0)
            return mkv_fail(ps->err, MKV_EFORMAT, "'%s': tensor '%.100s' has unknown type id %u",
                            g->path, t->name, (unsigned)t->type);
        uint64_t n = 1;
        for (int d = 0; d < MKV_GGUF_MAX_DIMS; d++) {
            if (__builtin_mul_overflow(n, t->ne[d], &n) || n > (uint64_t)INT64_MAX)
                return mkv_fail(ps->err, MKV_EFORMAT, "'%s': tensor '%.100s': the element count "
                                "overflows", g->path, t->name);
        }
        if (t->ne[0] % block != 0)
            return mkv_fail(ps->err, MKV_EFORMAT, "'%s': tensor '%.100s' of type %s: rows of %llu "
                            "elements are not a whole number of %u-element blocks", g->path, t->name,
                            mkv_ggml_type_name(t->type), (unsigned long long)t->ne[0], (unsigned)block);
        t->n_elements = n;
        if (__builtin_mul_overflow(n / block, (uint64_t)size, &t->nbytes))
            return mkv_fail(ps->err, MKV_EFORMAT, "'%s': tensor '%.100s': the byte size overflows",
                            g->path, t->name);
        if (t->offset % g->alignment != 0)
            return mkv_fail(ps->err, MKV_EFORMAT, "'%s': tensor '%.100s': offset %llu is not a "
                            "multiple of the alignment %u", g->path, t->name,
                            (unsigned long long)t->offset, (unsigned)g->alignment);
        if (t->offset > data_size || t->nbytes > data_size - t->offset)
            return mkv_fail(ps->err, MKV_EFORMAT, "'%s': tensor '%.100s': %llu bytes at data offset "
                            "%llu run past the end of the file (data area of %llu bytes)", g->path,
                            t->name, (unsigned long long)t->nbytes, (unsigned long long)t->offset,
                            (unsigned long long)data_size);
    }
    uint64_t *by_off = sorted_indices(g, g->n_tensors, by_tensor_offset);
    if (!by_off || !(g->tensor_by_name = sorted_indices(g, g->n_tensors, by_tensor_name))) {
        free(by_off);
        return mkv_fail(ps->err, MKV_ENOMEM, "'%s': out of memory", g->path);
    }
    int rc = MKV_OK;
    for (uint64_t i = 1; i < g->n_tensors && rc == MKV_OK; i++) {
        const mkv_gguf_tensor *a = &g->tensors[by_off[i - 1]], *b = &g->tensors[by_off[i]];
        if (a->offset + a->nbytes > b->offset)
            rc = mkv_fail(ps->err, MKV_EFORMAT, "'%s': tensors '%.100s' and '%.100s' overlap",
                          g->path, a->name, b->name);
        a = &g->tensors[g->tensor_by_name[i - 1]];
        b = &g->tensors[g->tensor_by_name[i]];
        if (rc == MKV_OK && strcmp(a->name, b->name) == 0)
            rc = mkv_fail(ps->err, MKV_EFORMAT, "'%s': tensor name '%.100s' appears twice", g->path,
                          a->name);
    }
    free(by_off);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        g->tensors[i].offset += g->data_offset;
        g->tensors[i].data = g->map + g->tensors[i].offset;
    }
    return rc;
}

static int parse(mkv_gguf *g, mkv_error *err)
{
    parser ps = {g, 0, err};
    int rc;
    if (g->size < 4 || memcmp(g->map, GGUF_MAGIC, 4) != 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s': not a GGUF file (no \"GGUF\" magic)", g->path);
    ps.pos = 4;
    if ((rc = read_u32(&ps, &g->version, "the header")))
        return rc;
    if (g->version == 1)
        return mkv_fail(err, MKV_EUNSUP, "'%s': GGUF version 1 is not supported (only 2 and 3)",
                        g->path);
    if (g->version != 2 && g->version != 3)
        return mkv_fail(err, MKV_EFORMAT, "'%s': unknown GGUF version %u%s", g->path,
                        (unsigned)g->version,
                        (g->version & 0xFFFF) == 0 ? " (a big-endian file?)" : "");
    if ((rc = read_u64(&ps, &g->n_tensors, "the header")) ||
        (rc = read_u64(&ps, &g->n_kv, "the header")))
        return rc;
    /* A metadata entry takes at least 8 + 1 + 4 + 1 bytes, a tensor info
     * 8 + 1 + 4 + 8 + 4 + 8. */
    if (g->n_kv > left(&ps) / 14)
        return mkv_fail(err, MKV_EFORMAT, "'%s': %llu metadata entries cannot fit in a file of %llu "
                        "bytes", g->path, (unsigned long long)g->n_kv, (unsigned long long)g->size);
    if (g->n_tensors > left(&ps) / 33)
        return mkv_fail(err, MKV_EFORMAT, "'%s': %llu tensors cannot fit in a file of %llu bytes",
                        g->path, (unsigned long long)g->n_tensors, (unsigned long long)g->size);
    if ((rc = parse_metadata(&ps)) || (rc = parse_tensor_infos(&ps)))
        return rc;
    uint64_t pad = (g->alignment - ps.pos % g->alignment) % g->alignment;
    g->data_offset = ps.pos + pad;
    if (g->n_tensors > 0 && g->data_offset > g->size)
        return mkv_fail(err, MKV_EFORMAT, "'%s': truncated: the data area would start at offset %llu "
                        "past the end of the file (%llu bytes)", g->path,
                        (unsigned long long)g->data_offset, (unsigned long long)g->size);
    return check_tensors(&ps);
}

void mkv_gguf_close(mkv_gguf *g)
{
    if (!g)
        return;
    if (g->map && g->size)
        munmap(g->map, g->size);
    while (g->arena) {
        arena_block *next = g->arena->next;
        free(g->arena);
        g->arena = next;
    }
    free(g->keys);
    free(g->values);
    free(g->kv_by_key);
    free(g->tensors);
    free(g->tensor_by_name);
    free(g->path);
    free(g);
}

int mkv_gguf_open(const char *path, mkv_gguf **out, mkv_error *err)
{
    *out = NULL;
    mkv_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->path = strdup(path))) {
        free(g);
        return mkv_fail(err, MKV_ENOMEM, "out of memory opening '%s'", path);
    }
    int rc = MKV_OK;
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0) {
        rc = mkv_fail_errno(err, MKV_EIO, errno, "cannot open '%s'", path);
    } else if (fstat(fd, &st) != 0) {
        rc = mkv_fail_errno(err, MKV_EIO, errno, "cannot stat '%s'", path);
    } else if (!S_ISREG(st.st_mode)) {
        rc = mkv_fail(err, MKV_EIO, "'%s': not a regular file", path);
    } else if ((uint64_t)st.st_size > SIZE_MAX) {
        rc = mkv_fail(err, MKV_EUNSUP, "'%s': too large to map", path);
    } else if (st.st_size < 24) {
        rc = mkv_fail(err, MKV_EFORMAT, "'%s': too short for a GGUF file (%lld bytes)", path,
                      (long long)st.st_size);
    } else {
        g->size = (size_t)st.st_size;
        void *m = mmap(NULL, g->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            g->size = 0;
            rc = mkv_fail_errno(err, MKV_EIO, errno, "cannot map '%s'", path);
        } else {
            g->map = m;
        }
    }
    if (fd >= 0)
        close(fd);
    if (rc == MKV_OK)
        rc = parse(g, err);
    if (rc) {
        mkv_gguf_close(g);
        return rc;
    }
    *out = g;
    return MKV_OK;
}

void mkv_gguf_release(const mkv_gguf *g, const mkv_gguf_tensor *t)
{
#ifdef MADV_DONTNEED
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t at = (uintptr_t)t->data, lo, hi;
    if (page <= 0 || !g->map || t->data < g->map || t->nbytes > g->size)
        return;
    lo = (at + (uintptr_t)page - 1) / (uintptr_t)page * (uintptr_t)page;
    hi = (at + (uintptr_t)t->nbytes) / (uintptr_t)page * (uintptr_t)page;
    /* a private read-only mapping of a file: dropped pages are read again
     * from the file if touched */
    if (hi > lo)
        madvise((void *)lo, hi - lo, MADV_DONTNEED);
#else
    (void)g;
    (void)t;
#endif
}

uint32_t mkv_gguf_version(const mkv_gguf *g) { return g->version; }
uint32_t mkv_gguf_alignment(const mkv_gguf *g) { return g->alignment; }
uint64_t mkv_gguf_data_offset(const mkv_gguf *g) { return g->data_offset; }
const char *mkv_gguf_path(const mkv_gguf *g) { return g->path; }
uint64_t mkv_gguf_n_kv(const mkv_gguf *g) { return g->n_kv; }
uint64_t mkv_gguf_n_tensors(const mkv_gguf *g) { return g->n_tensors; }

const char *mkv_gguf_kv_key(const mkv_gguf *g, uint64_t i)
{
    return i < g->n_kv ? g->keys[i] : NULL;
}

const mkv_gguf_value *mkv_gguf_kv_value(const mkv_gguf *g, uint64_t i)
{
    return i < g->n_kv ? &g->values[i] : NULL;
}

const mkv_gguf_value *mkv_gguf_find(const mkv_gguf *g, const char *key)
{
    uint64_t lo = 0, hi = g->n_kv;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(g->keys[g->kv_by_key[mid]], key);
        if (c == 0)
            return &g->values[g->kv_by_key[mid]];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const mkv_gguf_tensor *mkv_gguf_tensor_at(const mkv_gguf *g, uint64_t i)
{
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const mkv_gguf_tensor *mkv_gguf_find_tensor(const mkv_gguf *g, const char *name)
{
    uint64_t lo = 0, hi = g->n_tensors;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(g->tensors[g->tensor_by_name[mid]].name, name);
        if (c == 0)
            return &g->tensors[g->tensor_by_name[mid]];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* ------------------------------------------------------------ value access */

static int is_unsigned(mkv_gguf_type t)
{
    return t == MKV_GGUF_UINT8 || t == MKV_GGUF_UINT16 || t == MKV_GGUF_UINT32 || t == MKV_GGUF_UINT64;
}

static int is_signed(mkv_gguf_type t)
{
    return t == MKV_GGUF_INT8 || t == MKV_GGUF_INT16 || t == MKV_GGUF_INT32 || t == MKV_GGUF_INT64;
}

int mkv_gguf_value_int(const mkv_gguf_value *v, int64_t *out)
{
    if (!v)
        return -1;
    if (is_signed(v->type)) {
        *out = v->v.i;
        return 0;
    }
    if (is_unsigned(v->type) && v->v.u <= (uint64_t)INT64_MAX) {
        *out = (int64_t)v->v.u;
        return 0;
    }
    return -1;
}

int mkv_gguf_value_float(const mkv_gguf_value *v, double *out)
{
    if (!v)
        return -1;
    if (v->type == MKV_GGUF_FLOAT32 || v->type == MKV_GGUF_FLOAT64) {
        *out = v->v.f;
        return 0;
    }
    if (is_signed(v->type)) {
        *out = (double)v->v.i;
        return 0;
    }
    if (is_unsigned(v->type)) {
        *out = (double)v->v.u;
        return 0;
    }
    return -1;
}

int mkv_gguf_value_bool(const mkv_gguf_value *v, int *out)
{
    if (!v || v->type != MKV_GGUF_BOOL)
        return -1;
    *out = v->v.u != 0;
    return 0;
}

const char *mkv_gguf_value_str(const mkv_gguf_value *v, size_t *len)
{
    if (!v || v->type != MKV_GGUF_STRING)
        return NULL;
    if (len)
        *len = (size_t)v->n;
    return v->v.s;
}

/* Element i of an array of scalars, decoded. */
static int array_scalar(const mkv_gguf_value *arr, uint64_t i, mkv_gguf_value *out)
{
    if (!arr || arr->type != MKV_GGUF_ARRAY || i >= arr->n || !scalar_size(arr->elem_type))
        return -1;
    decode_scalar(arr->elem_type, arr->v.raw + i * scalar_size(arr->elem_type), out);
    return 0;
}

int mkv_gguf_array_int(const mkv_gguf_value *arr, uint64_t i, int64_t *out)
{
    mkv_gguf_value v;
    return array_scalar(arr, i, &v) == 0 ? mkv_gguf_value_int(&v, out) : -1;
}

int mkv_gguf_array_float(const mkv_gguf_value *arr, uint64_t i, double *out)
{
    mkv_gguf_value v;
    return array_scalar(arr, i, &v) == 0 ? mkv_gguf_value_float(&v, out) : -1;
}

const mkv_gguf_value *mkv_gguf_array_item(const mkv_gguf_value *arr, uint64_t i)
{
    if (!arr || arr->type != MKV_GGUF_ARRAY || i >= arr->n || scalar_size(arr->elem_type))
        return NULL;
    return &arr->v.items[i];
}
