#include "formats/formats.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

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
        ssize_t r = pread(s->fd, (char *)buf + got, len - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            return ckpt_fail(err, -e, "%s: reading %s at offset %llu: %s", s->path, what,
                             (unsigned long long)(off + got), strerror(e));
        }
        if (r == 0)
            return ckpt_fail(err, -EIO, "%s: file shrank while reading %s at offset %llu", s->path,
                             what, (unsigned long long)(off + got));
        got += (size_t)r;
    }
    return 0;
}
