#include "formats/formats.h"
#include "zstd_seekable.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

ssize_t ckpt_source_pread(const ckpt_source *s, void *buf, size_t len, uint64_t off) {
    if (s->zst) return zst_pread(s->zst, buf, len, off);
    if (s->member_of) { /* never past the member's end into the next one */
        if (off >= s->size) return 0;
        if (len > s->size - off) len = (size_t)(s->size - off);
        off += s->base;
    }
    for (;;) {
        ssize_t r = pread(s->fd, buf, len, (off_t)off);
        if (r >= 0) return r;
        if (errno != EINTR) return -errno;
    }
}

int source_read(const ckpt_catalog *cat, uint32_t source, uint64_t off, void *buf, size_t len,
                const char *what, ckpt_err *err) {
    const ckpt_source *s = &cat->sources[source];
    if (off > s->size || len > s->size - off)
        return ckpt_fail(err, -EINVAL,
                         "%s: %s at offset %llu (%zu bytes) runs past the end of "
                         "the file (size %llu)",
                         s->path, what, (unsigned long long)off, len, (unsigned long long)s->size);
    size_t got = 0;
    while (got < len) {
        ssize_t r = ckpt_source_pread(s, (char *)buf + got, len - got, off + got);
        if (r < 0)
            return ckpt_fail(err, (int)r, "%s: reading %s at offset %llu%s: %s", s->path, what,
                             (unsigned long long)(off + got),
                             s->zst ? " of the decompressed content" : "",
                             s->zst ? zst_last_error() : strerror((int)-r));
        if (r == 0)
            return ckpt_fail(err, -EIO, "%s: file shrank while reading %s at offset %llu", s->path,
                             what, (unsigned long long)(off + got));
        got += (size_t)r;
    }
    return 0;
}
