/* pwrite_pieces writes everything in PWRITE_PIECE pieces and fails as every core call does:
 * 0, or a negative errno (it returned positive ones, unlike the rest of core/). The bytes are
 * read back with plain pread. */
#include "tap.h"
#include "util/pwrite_pieces.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

int main(void) {
    char path[] = "/tmp/ckptfs-pwrite-pieces-XXXXXX";
    int fd = mkstemp(path);
    ok(fd >= 0, "a temporary file");
    if (fd < 0) return tap_done();
    unlink(path);
    size_t n = 3 * PWRITE_PIECE + 123;
    char *buf = malloc(n), *back = malloc(n);
    for (size_t i = 0; i < n; i++) buf[i] = (char)(i * 7 + 3);
    is_u64(pwrite_pieces(fd, buf, n, 10), 0, "%zu bytes (more than one piece) at offset 10", n);
    ok(pread(fd, back, n, 10) == (ssize_t)n && memcmp(back, buf, n) == 0,
       "the bytes read back are the bytes written");
    is_u64(lseek(fd, 0, SEEK_END), n + 10, "the file ends after them");
    close(fd);

    int ro = open("/dev/null", O_RDONLY | O_CLOEXEC);
    int rc = pwrite_pieces(ro, buf, 16, 0);
    ok(rc == -EBADF, "a read-only fd: -EBADF (got %d)", rc);
    close(ro);
    rc = pwrite_pieces(fd, buf, 16, 0);
    ok(rc == -EBADF, "a closed fd: -EBADF (got %d)", rc);
    int full = open("/dev/full", O_WRONLY | O_CLOEXEC);
    if (full >= 0) {
        rc = pwrite_pieces(full, buf, 16, 0);
        ok(rc == -ENOSPC, "/dev/full: -ENOSPC (got %d)", rc);
        close(full);
    }
    is_u64(pwrite_pieces(-1, buf, 0, 0), 0, "nothing to write: 0");
    free(buf);
    free(back);
    return tap_done();
}
