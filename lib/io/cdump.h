/* Compressed KV dumps (mkv_format="mosaickv-compressed", version 1).
 *
 *   /                     attrs: mkv_format, mkv_version=1, method, params
 *                         (canonical "key=value ..." of every parameter,
 *                         defaults included), model, n_layers, n_heads,
 *                         n_kv_heads, head_dim, n_tokens, rope_theta, k_rope,
 *                         source (raw dump it came from), created_by,
 *                         logical_bytes, physical_bytes, compression_ratio
 *   /query_pos            int32 [W]   copied from the raw dump
 *   /layers/NN/HH/...     one group per layer NN and KV head HH holding the
 *                         method's arrays (names and shapes: the method's
 *                         source file and man/mosaickv.5); attrs
 *                         logical_bytes, physical_bytes
 *
 * Byte accounting is structural, so nobody can claim a ratio: physical_bytes
 * is the sum over every dataset under /layers of (number of elements x
 * element size), element sizes being those of the stored HDF5 types (float16
 * 2, uint8 1, int16 2, int32 4, float32 4). Everything a method needs at
 * attention time -- values, bitmaps, indices, block keys, rotations, page
 * metadata, scales, dense windows, per-segment strategy tables -- is a
 * dataset, hence counted. logical_bytes is the dense 16-bit K+V of the same
 * tokens: 2 (K and V) x T x head_dim x 2 bytes per layer and head.
 * h5py can recompute both from the file. Arrays are stored without deflate
 * (chunking and filters would not change the count, only the file size). */
#ifndef MKV_CDUMP_H
#define MKV_CDUMP_H

#include <stdint.h>
#include "io/dump.h"
#include "core/mkv.h"

#define MKV_CDUMP_FORMAT "mosaickv-compressed"
#define MKV_CDUMP_VERSION 1

/* Element types of compressed arrays. Values handed in and out are float32
 * for the float types, fp16 bit patterns (uint16_t) for MKV_EL_F16_BITS
 * (stored as float16, like MKV_EL_F16), and the native integer type
 * otherwise. Floats must be finite on write and on read, except that
 * MKV_EL_F32_OR_NAN (stored as float32) takes NaN for "not measured";
 * infinities are refused always. */
typedef enum {
    MKV_EL_F16 = 0, MKV_EL_F32, MKV_EL_U8, MKV_EL_I16, MKV_EL_I32, MKV_EL_F32_OR_NAN, MKV_EL_F16_BITS
} mkv_el_type;
size_t mkv_el_size(mkv_el_type t);

typedef struct {
    char method[32];
    char params[1024];        /* canonical "key=value key=value ..." */
    char source[512];         /* path of the raw dump */
    char source_digest[MKV_KV_DIGEST_TEXT];  /* mkv_kv_digest_text of its K and V; "" when not recorded */
    mkv_dump_meta raw;        /* shape and model attributes of the raw dump (n_queries = W) */
    uint64_t logical_bytes;
    uint64_t physical_bytes;
} mkv_cdump_meta;

/* ---- writing ---- */
typedef struct mkv_cdump_writer mkv_cdump_writer;

/* Create path ("-" = stdout) atomically like mkv_dump_create; protect names
 * the input that must not be overwritten. query_pos [W] is copied. */
int mkv_cdump_create(const char *path, const char *protect, const mkv_cdump_meta *meta,
                     const int32_t *query_pos, mkv_cdump_writer **out, mkv_error *err);
/* Store array `name` (e.g. "k/values", may contain one '/') for layer/head:
 * rank 1..3, dims, data as float32 (F16/F32) or uint8/int16/int32. Adds
 * numel x element size to the head's and the file's physical bytes. */
int mkv_cdump_put(mkv_cdump_writer *w, int layer, int head, const char *name, mkv_el_type type,
                  int rank, const int64_t *dims, const void *data, mkv_error *err);
/* Small per-head or per-array attributes (not counted: strategy parameters
 * that also appear in counted tables, descriptive figures). */
int mkv_cdump_put_attr_int(mkv_cdump_writer *w, int layer, int head, const char *name, int64_t v, mkv_error *err);
int mkv_cdump_put_attr_double(mkv_cdump_writer *w, int layer, int head, const char *name, double v, mkv_error *err);
/* Physical bytes counted so far for one head / in total. */
uint64_t mkv_cdump_head_bytes(const mkv_cdump_writer *w, int layer, int head);
uint64_t mkv_cdump_total_bytes(const mkv_cdump_writer *w);
/* The digest of the source's K and V (mkv_kv_digest_text), recorded at commit. */
void mkv_cdump_set_source_digest(mkv_cdump_writer *w, const char *digest);
/* Finish: writes the byte totals and ratio, fsyncs, renames. Frees w. */
int mkv_cdump_commit(mkv_cdump_writer *w, mkv_error *err);
void mkv_cdump_abort(mkv_cdump_writer *w);

/* ---- reading ---- */
typedef struct mkv_cdump mkv_cdump;

/* A compressed dump held in memory: created like mkv_cdump_create, and
 * turned by mkv_cdump_commit_open into a reader of what was stored (the
 * same checks as mkv_cdump_open; messages name it "(memory)").  Frees w
 * whatever the outcome. */
int mkv_cdump_create_memory(const mkv_cdump_meta *meta, const int32_t *query_pos, mkv_cdump_writer **out,
                            mkv_error *err);
/* The same for one layer of meta's shape alone (a decoder compresses and
 * loads a layer at a time, so that the layers already loaded and the
 * compressed arrays never exist twice over): the writer takes only that
 * layer, and the reader holds, counts (logical and physical bytes) and
 * answers for only that layer. */
int mkv_cdump_create_memory_layer(const mkv_cdump_meta *meta, const int32_t *query_pos, int layer,
                                  mkv_cdump_writer **out, mkv_error *err);
int mkv_cdump_commit_open(mkv_cdump_writer *w, mkv_cdump **out, mkv_error *err);

int mkv_cdump_open(const char *path, mkv_cdump **out, mkv_error *err);
const mkv_cdump_meta *mkv_cdump_meta_of(const mkv_cdump *c);
/* Look up "key" in the recorded params; NULL if absent. */
const char *mkv_cdump_param(const mkv_cdump *c, const char *key, char *buf, size_t size);
/* Shape of an array: returns rank (0 if absent), fills dims. */
int mkv_cdump_shape(mkv_cdump *c, int layer, int head, const char *name, int64_t dims[3]);
/* Read a whole array into a buffer the caller allocated for its numel:
 * float32 for F16/F32 arrays, uint8/int16/int32 otherwise (the stored type
 * must match `type`). */
int mkv_cdump_get(mkv_cdump *c, int layer, int head, const char *name, mkv_el_type type,
                  void *out, size_t numel, mkv_error *err);
/* Allocating variant: *out = mkv_alloc'd buffer, *numel set. */
int mkv_cdump_get_alloc(mkv_cdump *c, int layer, int head, const char *name, mkv_el_type type,
                        void **out, size_t *numel, mkv_error *err);
int mkv_cdump_get_attr_int(mkv_cdump *c, int layer, int head, const char *name, int64_t *v, mkv_error *err);
int mkv_cdump_get_attr_double(mkv_cdump *c, int layer, int head, const char *name, double *v, mkv_error *err);
int mkv_cdump_read_query_pos(mkv_cdump *c, int32_t *out, mkv_error *err);
/* The path the dump was opened from, for messages. */
const char *mkv_cdump_path(const mkv_cdump *c);
void mkv_cdump_close(mkv_cdump *c);

/* ---- arrays of a known shape, as the methods store and load them ---- */
/* Present (rank > 0) or absent (0). */
int mkv_cdump_has(mkv_cdump *c, int layer, int head, const char *name);
/* Read array `name` of (layer, head), which must have exactly the given
 * rank and dims (MKV_EFORMAT naming the array otherwise), into a new
 * buffer *out (mkv_free). */
int mkv_cdump_get_shaped(mkv_cdump *c, int layer, int head, const char *name, mkv_el_type type, int rank,
                         const int64_t *dims, void **out, mkv_error *err);
/* Store a 2-D array (skipped when it has no rows: absent means empty). */
int mkv_cdump_put_rows(mkv_cdump_writer *w, int layer, int head, const char *name, mkv_el_type type,
                       int64_t rows, int64_t cols, const void *data, mkv_error *err);
/* Shape of the cache behind a compressed dump: tokens, head_dim, query
 * heads per KV head. */
void mkv_cdump_cache_shape(mkv_cdump *c, int64_t *T, int *d, int *G);

#endif
