#include "pwrite_pieces.h"

#include <errno.h>
#include <sys/types.h>
#include <unistd.h>

int pwrite_pieces(int fd, const void *p, size_t n, uint64_t at) {
    const char *c = p;
    while (n) {
        ssize_t w = pwrite(fd, c, n < PWRITE_PIECE ? n : PWRITE_PIECE, (off_t)at);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return w < 0 ? -errno : -ENOSPC;
        c += w;
        n -= (size_t)w;
        at += (uint64_t)w;
    }
    return 0;
}
