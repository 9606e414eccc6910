/* Reading NumPy .npy files, format versions 1.0, 2.0 and 3.0:
 *
 *   "\x93NUMPY", major, minor (0)
 *   header length: uint16 (v1) or uint32 (v2, v3), little-endian
 *   header: a Python dict literal
 *           {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
 *           padded with spaces, ending in '\n'
 *   data:   product(shape) elements, C order
 *
 * Supported descr: '<f2', '<f4', '<f8', '<i4', '<i8' (little-endian;
 * '|'/'=' byte orders are not accepted).  fortran_order must be False.
 * The file size must match the header exactly.  Data are read on demand
 * with pread. */
#ifndef MKV_NPY_H
#define MKV_NPY_H

#include <stddef.h>
#include <stdint.h>
#include "core/mkv.h"

#define MKV_NPY_MAX_DIMS 32
#define MKV_NPY_MAX_HEADER (1u << 20)

typedef struct {
    char descr[8];         /* as written, e.g. "<f4" */
    size_t elem_size;
    int is_float;
    int ndim;
    int64_t shape[MKV_NPY_MAX_DIMS];
    uint64_t numel;
    uint64_t data_offset;  /* absolute byte offset of the data */
    int version;           /* 1, 2 or 3 */
} mkv_npy_info;

typedef struct mkv_npy mkv_npy;

/* Open and validate (magic, version, header syntax, descr, shape, size). */
int mkv_npy_open(const char *path, mkv_npy **out, mkv_error *err);
void mkv_npy_close(mkv_npy *f);
const mkv_npy_info *mkv_npy_info_of(const mkv_npy *f);
const char *mkv_npy_path(const mkv_npy *f);

/* Read elements [first, first+count) (flat, C order) converted to float32
 * (integers are converted too). */
int mkv_npy_read_f32(mkv_npy *f, uint64_t first, size_t count, float *out, mkv_error *err);

#endif
