/* Bytes a decoder made at open (converted typed fields, datasets decoded by a library), held in
 * memory and read as one virtual source. */
#include "catalog.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct memory_source {
    unsigned char *bytes;
    size_t len;
} memory_source;

static ssize_t memory_pread(void *ctx, void *buf, size_t len, uint64_t off) {
    const memory_source *m = ctx;
    if (off >= m->len) return 0;
    size_t n = m->len - (size_t)off < len ? m->len - (size_t)off : len;
    memcpy(buf, m->bytes + off, n);
    return (ssize_t)n;
}

static const char *memory_last_error(void) {
    return "no error"; /* a read of memory cannot fail */
}

static void memory_release(void *ctx) {
    memory_source *m = ctx;
    free(m->bytes);
    free(m);
}

static const ckpt_virtual_ops memory_ops = {memory_pread, memory_last_error, memory_release};

int catalog_add_memory_source(ckpt_catalog *cat, const char *name, unsigned char *bytes, size_t len,
                              uint32_t *index, ckpt_err *err) {
    memory_source *m = malloc(sizeof *m);
    if (!m) {
        free(bytes);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    *m = (memory_source){bytes, len};
    int rc = catalog_add_virtual_source(cat, name, len, &memory_ops, m, index, err);
    if (rc) memory_release(m);
    return rc;
}
