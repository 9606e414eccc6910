#include "core/fileio.h"

#include <errno.h>
#include <sys/types.h>
#include <unistd.h>

int mkv_pread_full(int fd, void *buf, size_t n, uint64_t off)
{
    char *p = buf;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return errno;
        if (r == 0)
            return MKV_PREAD_EOF;
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}
