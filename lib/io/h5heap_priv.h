/* A guard for HDF5's global heap, used by h5file.c.
 *
 * libhdf5 1.10 loads a global heap collection (where variable-length
 * strings live) by walking its object list without checking it: an object
 * of size 0 makes the walk loop forever (H5HG_read never returns), an
 * object running past the end of its collection makes later reads go past
 * it. No HDF5 call reads a variable-length attribute's heap reference
 * without following it, so the check sits below the library: the files a
 * reader opens go through HDF5's own sec2 (named file) or core (file image)
 * driver with only the read callback wrapped. While a watch is on, every
 * collection the library reads is walked the way libhdf5 will walk it, and
 * one it would loop on or read past makes the read fail, so HDF5 returns an
 * error instead. */
#ifndef MKV_H5HEAP_PRIV_H
#define MKV_H5HEAP_PRIV_H

#include <hdf5.h>
#include <stddef.h>

/* A file access property list for opening path read-only, or the len
 * bytes at image (copied), through the watched driver. Returns a negative
 * id on failure. */
hid_t mkv_h5heap_fapl_file(const char *path);
hid_t mkv_h5heap_fapl_image(const void *image, size_t len);

/* Watch the reads made for obj's file from now on (a file opened without
 * these property lists is not watched, and never refused). */
void mkv_h5heap_watch_begin(hid_t obj);
/* End the watch. Returns NULL, or why a collection was refused ("the
 * global heap collection at byte N is damaged: ..."; static storage). */
const char *mkv_h5heap_watch_end(void);

#endif
