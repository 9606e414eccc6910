/* HDF5 file access shared by every format: opening with clear errors,
 * "-" for stdin through an in-memory file image, output through
 * core/outfile (a regular file by temporary and rename; stdout, pipes and
 * devices through an in-memory image copied out when complete),
 * attributes. */
#ifndef MKV_H5FILE_H
#define MKV_H5FILE_H

#include <hdf5.h>
#include "core/mkv.h"
#include "core/outfile.h"

/* Turn off HDF5's automatic error stack printing (call once per process). */
void mkv_h5_quiet(void);

/* Open an existing HDF5 file read-only. path "-" reads stdin into a file
 * image. Errors: "cannot open 'x': No such file or directory",
 * "'x' is empty", "'x' is not an HDF5 file", "'x' is truncated or damaged". */
int mkv_h5_open_read(const char *path, hid_t *fid, mkv_error *err);

/* An output file being written. */
typedef struct {
    mkv_outfile file;
    hid_t fid;
} mkv_h5_out;

/* Create an output file (see core/outfile.h for what a path may name).
 * path "-" writes to stdout when finished; a terminal is refused. protect
 * (may be NULL) names an input the output must not overwrite. */
int mkv_h5_create(const char *path, const char *protect, mkv_h5_out *out, mkv_error *err);
/* An HDF5 file held in memory only (nothing is ever written out): for a
 * compressed cache built and read back within one process. */
int mkv_h5_create_memory(mkv_h5_out *out, mkv_error *err);
/* Close, fsync and rename into place (or write the image through). On
 * failure the temporary is removed and nothing appears under the name. */
int mkv_h5_finish(mkv_h5_out *out, mkv_error *err);
/* Abandon the output: close and remove the temporary. Safe to call twice. */
void mkv_h5_discard(mkv_h5_out *out);

/* Attributes on an object (file root, group or dataset). */
int mkv_h5_attr_put_str(hid_t obj, const char *name, const char *value, mkv_error *err);
int mkv_h5_attr_put_int(hid_t obj, const char *name, int64_t value, mkv_error *err);
int mkv_h5_attr_put_double(hid_t obj, const char *name, double value, mkv_error *err);
/* Getters return MKV_EFORMAT with "missing attribute 'name'" when absent. */
int mkv_h5_attr_get_str(hid_t obj, const char *name, char *buf, size_t bufsize, mkv_error *err);
int mkv_h5_attr_get_int(hid_t obj, const char *name, int64_t *value, mkv_error *err);
int mkv_h5_attr_get_double(hid_t obj, const char *name, double *value, mkv_error *err);
int mkv_h5_has_attr(hid_t obj, const char *name);
/* H5Dread with H5P_DEFAULT, after checking the dataset's layout: a chunk
 * shape beyond the dataset's (fixed) shape, or of more than a GiB, is a
 * damaged file that HDF5 1.10 reads past its own buffers; it fails (< 0)
 * like any read. Every dataset read of the formats goes through it. */
herr_t mkv_h5_dread(hid_t ds, hid_t mem_type, hid_t mspace, hid_t fspace, void *buf);
int mkv_h5_has_link(hid_t loc, const char *path); /* path may have several components */

#endif
