/* Internals shared by dump.c (I/O) and validate.c (checks). */
#ifndef MKV_DUMP_PRIV_H
#define MKV_DUMP_PRIV_H

#include <hdf5.h>
#include "io/cdump.h"
#include "io/dump.h"

/* "/layers/NN/k" for layer and kind. */
void mkv_dump_dset_name(char *buf, size_t size, int layer, char kind);

/* Storage type of a k/v/q dataset: float32 (or float64, converted by
 * HDF5), IEEE half, or uint16 with attribute dtype="bfloat16". Returns 0,
 * or -1 with a reason in why. */
int mkv_dump_dset_dtype(hid_t dset, mkv_dtype *t, char *why, size_t whysize);

/* Read a hyperslab [h0:h0+nh, t0:t0+nt, 0:d] of a 3-D dataset of storage
 * type t into float32 out. */
int mkv_dump_read_slab(hid_t dset, mkv_dtype t, int h0, int nh, int64_t t0, int64_t nt, int d,
                       float *out, mkv_error *err);

/* Dimensions of a dataset; returns its rank (<= 3 filled) or -1. */
int mkv_dump_dset_dims(hid_t dset, hsize_t dims[3]);

/* Read and check mkv_format, mkv_version and the shape attributes of an
 * open file into m (n_tokens/n_queries are left 0). */
int mkv_dump_read_meta(hid_t fid, const char *path, mkv_dump_meta *m, mkv_error *err);
/* The model attributes raw and compressed dumps share: n_layers, n_heads,
 * n_kv_heads, head_dim (range-checked), rope_theta, model, k_rope and
 * created_by; errors name the file as path. */
int mkv_dump_read_model_attrs(hid_t fid, const char *path, mkv_dump_meta *m, mkv_error *err);

/* The checks of the model attributes every open applies, to raw dumps and
 * to the metadata compressed dumps copy: n_layers 1..1000, n_heads and
 * n_kv_heads 1..1000000 with n_heads a multiple of n_kv_heads, head_dim
 * 1..4096, rope_theta finite and positive, k_rope "post" or "pre", source
 * capture, import or synthetic. */
int mkv_dump_check_model(const mkv_dump_meta *m, mkv_error *err);

/* Refuse (MKV_EFORMAT, naming name) a dataset of rank <= 3 whose dims
 * claim more data than a file of file_size bytes can hold, even at
 * deflate's highest compression ratio: a damaged dimension, not a size
 * worth reading. */
int mkv_dump_check_extent(hid_t dset, const char *name, int rank, const hsize_t *dims, hsize_t file_size,
                          mkv_error *err);

/* Read the n values of a 1-D integer dataset in its stored type (so
 * nothing is clipped to int32 on the way) into out. *bad is the index of
 * the first value outside lo..hi, with that value in *bad_value, or -1
 * when every value is inside (only then is out complete). */
int mkv_dump_read_ints(hid_t dset, int64_t n, int64_t lo, int64_t hi, int32_t *out, int64_t *bad,
                       int64_t *bad_value, mkv_error *err);

/* mkv_dump_open and mkv_cdump_open over a file mkv_h5_open_read opened
 * from path (messages name "-" as "(stdin)"), so that a caller can look at
 * the file before it knows which kind of dump it is. They take fid over,
 * and close it on failure. */
int mkv_dump_open_fid(hid_t fid, const char *path, mkv_dump **out, mkv_error *err);
int mkv_cdump_open_fid(hid_t fid, const char *path, mkv_cdump **out, mkv_error *err);

/* HDF5 type for IEEE binary16 (caller closes). */
hid_t mkv_h5_f16_type(void);

#endif
