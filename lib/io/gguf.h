/* The GGUF container (llama.cpp's model file format, versions 2 and 3):
 *
 *   "GGUF", uint32 version, uint64 tensor count, uint64 metadata count
 *   metadata: string key, uint32 value type, value
 *   tensor infos: string name, uint32 n_dims, uint64 ne[n_dims],
 *                 uint32 ggml type, uint64 offset (from the data start)
 *   padding to general.alignment (default 32), then the tensor data
 *
 * Strings are a uint64 length and that many bytes; arrays a uint32 element
 * type, a uint64 count and the elements (arrays of arrays allowed).  All
 * little-endian.  ne[0] is the innermost dimension: a matrix of ne = [in,
 * out] is stored row-major as out rows of in values, which is mkv_model's
 * [out x in] layout.
 *
 * mkv_gguf_open maps the file and checks everything before handing it out:
 * every length, count and offset against the file size (overflow-checked),
 * value types, nesting depth, duplicate keys and tensor names, tensor types
 * and shapes (rows a whole number of blocks), offsets aligned and inside
 * the data area, tensors not overlapping.  Tensor data are read from the
 * mapping on demand.
 *
 * The ggml tensor types are part of the format: the reader knows the name,
 * block size and block bytes of every type ggml defines, so that it can
 * check the tensor directory; converting the data to floats is
 * model/ggml_quant.h's job.
 */
#ifndef MKV_IO_GGUF_H
#define MKV_IO_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include "core/mkv.h"

typedef enum {
    MKV_GGUF_UINT8 = 0,
    MKV_GGUF_INT8 = 1,
    MKV_GGUF_UINT16 = 2,
    MKV_GGUF_INT16 = 3,
    MKV_GGUF_UINT32 = 4,
    MKV_GGUF_INT32 = 5,
    MKV_GGUF_FLOAT32 = 6,
    MKV_GGUF_BOOL = 7,
    MKV_GGUF_STRING = 8,
    MKV_GGUF_ARRAY = 9,
    MKV_GGUF_UINT64 = 10,
    MKV_GGUF_INT64 = 11,
    MKV_GGUF_FLOAT64 = 12
} mkv_gguf_type;

#define MKV_GGUF_MAX_DIMS 4
#define MKV_GGUF_MAX_DEPTH 8           /* arrays nested deeper are refused */
#define MKV_GGUF_DEFAULT_ALIGNMENT 32

/* One metadata value. */
typedef struct mkv_gguf_value {
    mkv_gguf_type type;
    mkv_gguf_type elem_type;  /* arrays: type of the elements */
    uint64_t n;               /* arrays: elements; strings: bytes */
    union {
        uint64_t u;                          /* unsigned integers, bool */
        int64_t i;                           /* signed integers */
        double f;                            /* float32, float64 */
        const char *s;                       /* string: n bytes + NUL (a copy) */
        const unsigned char *raw;            /* array of scalars: n little-endian
                                                elements inside the mapping */
        const struct mkv_gguf_value *items;  /* array of strings or arrays */
    } v;
} mkv_gguf_value;

typedef struct {
    const char *name;
    uint32_t n_dims;
    uint64_t ne[MKV_GGUF_MAX_DIMS]; /* ne[0] innermost; unused dims are 1 */
    uint32_t type;                  /* ggml type id */
    uint64_t n_elements;
    uint64_t offset;                /* absolute byte offset in the file */
    uint64_t nbytes;
    const unsigned char *data;      /* inside the mapping */
} mkv_gguf_tensor;

typedef struct mkv_gguf mkv_gguf;

/* Open, map and validate.  Errors start with "'path': ". */
int mkv_gguf_open(const char *path, mkv_gguf **out, mkv_error *err);
void mkv_gguf_close(mkv_gguf *g);

uint32_t mkv_gguf_version(const mkv_gguf *g);
uint32_t mkv_gguf_alignment(const mkv_gguf *g);
uint64_t mkv_gguf_data_offset(const mkv_gguf *g);
const char *mkv_gguf_path(const mkv_gguf *g);

/* Metadata in file order, and by key (NULL when absent). */
uint64_t mkv_gguf_n_kv(const mkv_gguf *g);
const char *mkv_gguf_kv_key(const mkv_gguf *g, uint64_t i);
const mkv_gguf_value *mkv_gguf_kv_value(const mkv_gguf *g, uint64_t i);
const mkv_gguf_value *mkv_gguf_find(const mkv_gguf *g, const char *key);

const char *mkv_gguf_type_name(mkv_gguf_type t); /* "uint32", "string", ... */

/* Scalar reads: 0 on success, -1 when v (or element i of array v) is NULL,
 * out of range or of another kind.  Integers: any integer type whose value
 * fits int64.  Floats: float32/float64 or any integer.  Bool: bool only. */
int mkv_gguf_value_int(const mkv_gguf_value *v, int64_t *out);
int mkv_gguf_value_float(const mkv_gguf_value *v, double *out);
int mkv_gguf_value_bool(const mkv_gguf_value *v, int *out);
/* String contents (NUL-terminated, *len bytes) or NULL. */
const char *mkv_gguf_value_str(const mkv_gguf_value *v, size_t *len);
int mkv_gguf_array_int(const mkv_gguf_value *arr, uint64_t i, int64_t *out);
int mkv_gguf_array_float(const mkv_gguf_value *arr, uint64_t i, double *out);
/* Element i of an array of strings or arrays, or NULL. */
const mkv_gguf_value *mkv_gguf_array_item(const mkv_gguf_value *arr, uint64_t i);

/* Tensors in file order, and by name (NULL when absent). */
uint64_t mkv_gguf_n_tensors(const mkv_gguf *g);
const mkv_gguf_tensor *mkv_gguf_tensor_at(const mkv_gguf *g, uint64_t i);
const mkv_gguf_tensor *mkv_gguf_find_tensor(const mkv_gguf *g, const char *name);
/* The tensor's bytes will not be read again soon: the whole pages of the
 * file mapping inside them are dropped from memory (a loader that copied
 * or converted them does not hold the file twice).  Reading them later
 * still works: they come back from the file. */
void mkv_gguf_release(const mkv_gguf *g, const mkv_gguf_tensor *t);

/* ggml type name ("Q4_K"), or NULL for an id ggml does not define. */
const char *mkv_ggml_type_name(uint32_t type);
/* Elements per block and bytes per block; 0 for an unknown id. */
uint32_t mkv_ggml_block_size(uint32_t type);
uint32_t mkv_ggml_type_size(uint32_t type);

#endif
