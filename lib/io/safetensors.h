/* Reading .safetensors files (Hugging Face format):
 *
 *   8 bytes     little-endian uint64 N, the header length
 *   N bytes     JSON object: "name": {"dtype": "F16", "shape": [..],
 *               "data_offsets": [begin, end]}, ..., and optionally
 *               "__metadata__": {"key": "string", ...}
 *   the rest    the data area; offsets are relative to its start
 *
 * mkv_st_open checks everything before handing out a tensor: the header
 * length against the file size and MKV_ST_MAX_HEADER, the JSON, every
 * dtype, shape and offset pair (begin <= end, inside the data area,
 * end - begin == product(shape) * element size without overflow), and that
 * no two tensors' bytes overlap.  Only the header is read at open; tensor
 * data are read on demand with pread, so shards of any size are fine and
 * one open file may be read from several threads at once. */
#ifndef MKV_SAFETENSORS_H
#define MKV_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "core/json.h"
#include "core/mkv.h"

/* Same limit as the reference implementation. */
#define MKV_ST_MAX_HEADER 100000000u
#define MKV_ST_MAX_DIMS 8

/* Every dtype of the safetensors specification (all little-endian). */
typedef enum {
    MKV_ST_BOOL = 0,
    MKV_ST_U8,
    MKV_ST_I8,
    MKV_ST_F8_E5M2,
    MKV_ST_F8_E4M3,
    MKV_ST_I16,
    MKV_ST_U16,
    MKV_ST_F16,
    MKV_ST_BF16,
    MKV_ST_I32,
    MKV_ST_U32,
    MKV_ST_F32,
    MKV_ST_F64,
    MKV_ST_I64,
    MKV_ST_U64
} mkv_st_dtype;

typedef struct {
    const char *name;              /* valid while the file is open */
    mkv_st_dtype dtype;
    int ndim;                      /* 0 = scalar */
    int64_t shape[MKV_ST_MAX_DIMS];
    uint64_t numel;                /* product of shape (1 for a scalar) */
    uint64_t offset;               /* absolute byte offset in the file */
    uint64_t nbytes;
} mkv_st_tensor;

typedef struct mkv_st_file mkv_st_file;

const char *mkv_st_dtype_name(mkv_st_dtype t); /* "F16", "BF16", ... */
size_t mkv_st_dtype_size(mkv_st_dtype t);

/* Open and validate.  Errors name the file: "'x.safetensors': header
 * length 9999 exceeds the file size (120 bytes)". */
int mkv_st_open(const char *path, mkv_st_file **out, mkv_error *err);
void mkv_st_close(mkv_st_file *f);
const char *mkv_st_path(const mkv_st_file *f);

/* Tensors in header order. */
size_t mkv_st_count(const mkv_st_file *f);
const mkv_st_tensor *mkv_st_tensor_at(const mkv_st_file *f, size_t i);
/* By name, O(1); NULL when absent. */
const mkv_st_tensor *mkv_st_find(const mkv_st_file *f, const char *name);
/* The "__metadata__" object (string values), or NULL when absent. */
const mkv_json *mkv_st_metadata(const mkv_st_file *f);

/* Elements per index of the first dimension (product of shape[1..]);
 * a slice of rows [r0, r0+nr) is elements [r0*row, (r0+nr)*row). */
uint64_t mkv_st_row_elems(const mkv_st_tensor *t);

/* Read elements [first, first+count) of t (flat, row-major).
 *  _f32: from F32, F16, BF16 or F64, converted to float32;
 *  _i32: from any integer dtype or BOOL, refusing values outside int32;
 *  _raw: the stored bytes unchanged (count * mkv_st_dtype_size bytes).
 * A dtype the function cannot convert gives MKV_EUNSUP; a range outside
 * the tensor MKV_EUSAGE; a short read (file truncated since open) MKV_EIO. */
int mkv_st_read_f32(mkv_st_file *f, const mkv_st_tensor *t, uint64_t first, size_t count,
                    float *out, mkv_error *err);
int mkv_st_read_i32(mkv_st_file *f, const mkv_st_tensor *t, uint64_t first, size_t count,
                    int32_t *out, mkv_error *err);
int mkv_st_read_raw(mkv_st_file *f, const mkv_st_tensor *t, uint64_t first, size_t count,
                    void *out, mkv_error *err);

#endif
