/* Output files: the one way every tool writes a named output or standard
 * output, so that writing can never destroy a file.
 *
 * A regular file (or a name that does not exist yet) is written to a
 * temporary ".NAME.mkvtmp.PID.XXXXXX" beside it, synced and renamed onto
 * it when complete; a symbolic link is followed and its final target is
 * the one replaced (a dangling link gets its target created), so the link
 * stays. Anything else -- a character device, a FIFO, "-" for standard
 * output -- is written through; it cannot be replaced and cannot be
 * seeked in. A name of one of the process's own descriptors (/dev/stdout,
 * /dev/fd/N, /proc/self/fd/N: a pipe from bash's >(...), a file opened by
 * the shell's > or >>) is written through a duplicate of that descriptor,
 * whatever it is, so the shell's redirection means what it says. A write
 * error (ENOSPC from /dev/full, EPIPE) is an error like any other.
 *
 * Before a temporary is made, stale temporaries of the same target left by
 * a process that no longer exists (killed before it could clean up) are
 * removed. SIGINT, SIGTERM, SIGHUP and SIGPIPE remove the temporaries of
 * the running process, except a signal the process inherited as ignored,
 * which stays ignored. */
#ifndef MKV_OUTFILE_H
#define MKV_OUTFILE_H

#include <stdio.h>
#include "core/mkv.h"

/* A temporary older than this many seconds whose process is gone is stale. */
#define MKV_OUTFILE_STALE_SECONDS 5

/* Flags of mkv_outfile_open. */
#define MKV_OUTFILE_BINARY 1   /* refuse a terminal as the destination */

typedef struct {
    char *name;       /* as given, for messages; NULL for "-" */
    char *target;     /* the regular file renamed onto; NULL when written through */
    char *tmp_path;   /* the temporary beside target; NULL when written through */
    FILE *fp;         /* what to write to: the temporary, the stream, or stdout */
    int is_stdout;
} mkv_outfile;

/* Whether writing path would replace the file input: the same name, the
 * same device and inode, or the same name in the same directory (so that
 * two outputs not created yet are told apart too; never for "-" or a NULL
 * input). */
int mkv_outfile_overwrites(const char *path, const char *input);

/* Open an output. path "-" is standard output. protect (may be NULL or
 * "-") names an input the output must not overwrite. Errors:
 * "cannot create 'x': No such file or directory", "output 'x' would
 * overwrite the input" (MKV_EUSAGE), binary output to a terminal
 * (MKV_EUSAGE). */
int mkv_outfile_open(mkv_outfile *o, const char *path, const char *protect, int flags, mkv_error *err);

/* The stream to write to (buffered). */
FILE *mkv_outfile_fp(const mkv_outfile *o);

/* The temporary file's path when the output is seekable (renamed into
 * place on commit), NULL when it is written through. A caller that writes
 * the temporary by name (HDF5) does so before commit. */
const char *mkv_outfile_seekable_path(const mkv_outfile *o);

/* Write n bytes (retrying short writes); errors name the output. */
int mkv_outfile_write(mkv_outfile *o, const void *buf, size_t n, mkv_error *err);

/* Flush and finish: fsync and rename a temporary into place (and sync the
 * directory), or flush and close a written-through stream. On failure the
 * temporary is removed and nothing appears under the name. */
int mkv_outfile_commit(mkv_outfile *o, mkv_error *err);

/* Abandon the output: close and remove the temporary. Safe to call twice
 * and after commit. */
void mkv_outfile_abort(mkv_outfile *o);

/* Remove the stale temporaries of target (see above); returns how many
 * were removed. mkv_outfile_open calls it; exposed for tests. */
int mkv_outfile_remove_stale(const char *target);

#endif
