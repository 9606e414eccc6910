/* Whole reads at an offset: what the safetensors and .npy readers need of
 * a file descriptor. */
#ifndef MKV_FILEIO_H
#define MKV_FILEIO_H

#include <stddef.h>
#include <stdint.h>

#define MKV_PREAD_EOF (-1)

/* Read exactly n bytes at off (retrying short reads and EINTR): 0, an
 * errno value, or MKV_PREAD_EOF when the file ends first. */
int mkv_pread_full(int fd, void *buf, size_t n, uint64_t off);

#endif
