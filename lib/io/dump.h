/* KV dump format, version 1 (docs/DESIGN.md 4, man/mosaickv.5).
 *
 *   /                attrs mkv_format="mosaickv-dump", mkv_version=1, model,
 *                    n_layers, n_heads, n_kv_heads, head_dim, rope_theta,
 *                    k_rope ("post"|"pre"), source, created_by
 *   /tokens          int32 [T]             (absent for synthetic dumps)
 *   /layers/NN/k     float [n_kv_heads, T, head_dim]
 *   /layers/NN/v     float [n_kv_heads, T, head_dim]
 *   /layers/NN/q     float [n_heads, W, head_dim]
 *   /query_pos       int32 [W]
 *
 * Values are float32, float16 or bfloat16 (stored as uint16 with attribute
 * dtype="bfloat16"); the API always hands out float32. */
#ifndef MKV_DUMP_H
#define MKV_DUMP_H

#include <stdint.h>
#include "core/mkv.h"
#include "core/tensor.h"

#define MKV_DUMP_FORMAT "mosaickv-dump"
#define MKV_DUMP_VERSION 1

typedef struct {
    char model[256];
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    double rope_theta;
    char k_rope[16];       /* "post" or "pre" */
    char source[16];       /* "capture", "import" or "synthetic" */
    char created_by[256];
    int64_t n_tokens;      /* T */
    int64_t n_queries;     /* W */
    mkv_dtype dtype;       /* storage type of k, v and q */
    int has_tokens;        /* /tokens present */
} mkv_dump_meta;

/* Fill meta with defaults (k_rope "post", rope_theta 10000, dtype float16,
 * created_by "mosaickv VERSION"). */
void mkv_dump_meta_init(mkv_dump_meta *meta);
/* Check that the shape attributes are consistent (positive, n_heads a
 * multiple of n_kv_heads, ...). */
int mkv_dump_meta_check(const mkv_dump_meta *meta, mkv_error *err);

/* ---- reading ---- */
typedef struct mkv_dump mkv_dump;

/* Open and read the header; checks format, version and that every dataset
 * exists with the shape the attributes imply (data are not read). */
int mkv_dump_open(const char *path, mkv_dump **out, mkv_error *err);
const mkv_dump_meta *mkv_dump_meta_of(const mkv_dump *d);
const char *mkv_dump_path(const mkv_dump *d);
/* Read heads [h0, h0+nh) and positions [t0, t0+nt) of /layers/NN/<kind>
 * (kind 'k', 'v' or 'q'; for 'q' positions index the W queries) into out,
 * float32 laid out [nh][nt][head_dim]. Reads only that hyperslab. */
int mkv_dump_read(mkv_dump *d, int layer, char kind, int h0, int nh,
                  int64_t t0, int64_t nt, float *out, mkv_error *err);
/* Read like mkv_dump_read, then refuse a NaN or infinity with MKV_EFORMAT:
 * "'FILE': /layers/NN/k: NaN at [head,position,channel]". */
int mkv_dump_read_finite(mkv_dump *d, int layer, char kind, int h0, int nh, int64_t t0, int64_t nt,
                         float *out, mkv_error *err);
int mkv_dump_read_tokens(mkv_dump *d, int32_t *out, mkv_error *err);     /* [T] */
/* The content digest of a dump's K and V that a compressed dump records of
 * its source: CRC-32 (zlib's) over the float32 values, little-endian, of
 * /layers/00/k then /layers/00/v, then layer 01, ..., each laid out as
 * mkv_dump_read gives it ([n_kv_heads][T][head_dim]). Feed the arrays in
 * that order, starting from crc = 0; the text is "crc32:%08x". */
uint32_t mkv_kv_digest_update(uint32_t crc, const float *x, size_t n);
#define MKV_KV_DIGEST_TEXT 16
void mkv_kv_digest_text(uint32_t crc, char text[MKV_KV_DIGEST_TEXT]);
int mkv_dump_read_query_pos(mkv_dump *d, int32_t *out, mkv_error *err);  /* [W] */
/* Bytes the datasets take in the file (after deflate) and uncompressed. */
int mkv_dump_storage_bytes(mkv_dump *d, uint64_t *stored, uint64_t *raw, mkv_error *err);
void mkv_dump_close(mkv_dump *d);

/* ---- writing ---- */
typedef struct {
    int deflate;            /* 0..9, default 4 (0: no filter) */
    int64_t chunk_tokens;   /* chunk length along T, default 1024 (clamped to T) */
    const char *protect;    /* input path that must not be overwritten, or NULL */
} mkv_dump_write_opts;

void mkv_dump_write_opts_init(mkv_dump_write_opts *o);

typedef struct mkv_dump_writer mkv_dump_writer;

/* Create a dump at path ("-" = stdout) for meta; every dataset is created
 * at once, filled by mkv_dump_write*. Nothing appears under path before
 * mkv_dump_commit succeeds. */
int mkv_dump_create(const char *path, const mkv_dump_meta *meta,
                    const mkv_dump_write_opts *opts, mkv_dump_writer **out, mkv_error *err);
/* Write heads [h0, h0+nh) x positions [t0, t0+nt) of /layers/NN/<kind>
 * from float32 data laid out [nh][nt][head_dim]. Non-finite values are
 * refused. */
int mkv_dump_write(mkv_dump_writer *w, int layer, char kind, int h0, int nh,
                   int64_t t0, int64_t nt, const float *data, mkv_error *err);
int mkv_dump_write_tokens(mkv_dump_writer *w, const int32_t *tokens, mkv_error *err);
int mkv_dump_write_query_pos(mkv_dump_writer *w, const int32_t *pos, mkv_error *err);
/* Add a string attribute to the root (extensions: e.g. weights="random"). */
int mkv_dump_set_attr(mkv_dump_writer *w, const char *name, const char *value, mkv_error *err);
/* Finish: all of tokens (when has_tokens) and query_pos must have been
 * written; flush, fsync, rename. Frees w whatever the outcome. */
int mkv_dump_commit(mkv_dump_writer *w, mkv_error *err);
/* Abandon: remove the temporary file, free w. */
void mkv_dump_abort(mkv_dump_writer *w);

/* ---- validation ---- */
/* Called once per problem found with a one-line description. */
typedef void (*mkv_problem_fn)(void *ctx, const char *problem);
/* Check everything: attributes, shapes, dtypes, query_pos range
 * (0 <= p < T), tokens, NaN/Inf in every dataset (read in chunks).
 * Returns the number of problems (0 = valid), or -1 with err set when the
 * file cannot be read at all. */
int mkv_dump_validate(const char *path, mkv_problem_fn report, void *ctx, mkv_error *err);

#endif
