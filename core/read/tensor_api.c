/* The catalog and a tensor's bytes through plain functions (declared in ckpt.h), for callers of
 * libckpt.so that do not mirror its structs: ctypes, other languages' FFI. The read is the
 * one every front end makes: plan the range, then gather the segments (segread). */
#include "../ckpt.h"
#include "segread.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

size_t ckpt_tensor_count(const ckpt_catalog *cat) {
    return cat ? cat->ntensors : 0;
}

const ckpt_tensor *ckpt_tensor_at(const ckpt_catalog *cat, size_t i) {
    return cat && i < cat->ntensors ? &cat->tensors[i] : NULL;
}

const ckpt_tensor *ckpt_tensor_find(const ckpt_catalog *cat, const char *name) {
    if (!cat || !name) return NULL;
    size_t len = strlen(name);
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        if (t->name_len == len && memcmp(t->name, name, len) == 0) return t;
    }
    return NULL;
}

const char *ckpt_tensor_name(const ckpt_tensor *t, size_t *len) {
    if (len) *len = t->name_len;
    return t->name;
}

const char *ckpt_tensor_dtype(const ckpt_tensor *t) {
    const ckpt_dtype_info *info = ckpt_dtype_info_of(t->dtype);
    return info ? info->name : "?";
}

uint32_t ckpt_tensor_ndim(const ckpt_tensor *t) {
    return t->ndim;
}

uint64_t ckpt_tensor_dim(const ckpt_tensor *t, uint32_t i) {
    return i < t->ndim ? t->shape[i] : 0;
}

uint64_t ckpt_tensor_nbytes(const ckpt_tensor *t) {
    return t->nbytes;
}

/* Segments planned per round: a range over many shards is read in several rounds. */
enum { ROUND_SEGMENTS = 64 };

int ckpt_tensor_read(const ckpt_catalog *cat, const ckpt_tensor *t, uint64_t off, void *buf,
                     size_t len, ckpt_err *err) {
    if (off > t->nbytes || len > t->nbytes - off)
        return ckpt_fail(err, -EINVAL,
                         "%.*s: bytes %llu..+%zu are past the end of the tensor (%llu bytes)",
                         (int)(t->name_len > 200 ? 200 : t->name_len), t->name,
                         (unsigned long long)off, len, (unsigned long long)t->nbytes);
    char *scratch = malloc(SEGREAD_SCRATCH);
    if (!scratch) return ckpt_fail(err, -ENOMEM, "out of memory reading a tensor");
    ckpt_segment seg[ROUND_SEGMENTS];
    char *dst = buf;
    uint64_t at = off, left = len;
    int rc = 0;
    while (left > 0 && rc == 0) {
        uint64_t done = 0;
        size_t n = ckpt_plan(t, at, left, seg, ROUND_SEGMENTS, &done);
        if (n == 0 || done == 0) {
            rc = -EIO;
            break;
        }
        for (size_t i = 0; i < n; i++)
            if (seg[i].kind == CKPT_SEG_HOLE) rc = -EIO; /* bytes no file holds */
        if (rc == 0) rc = ckpt_read_segments(cat, seg, n, dst, scratch);
        dst += done;
        at += done;
        left -= done;
    }
    free(scratch);
    if (rc < 0)
        return ckpt_fail(
            err, rc, "%.*s: reading bytes %llu..+%zu: %s",
            (int)(t->name_len > 200 ? 200 : t->name_len), t->name, (unsigned long long)off, len,
            rc == -EIO ? "bytes no file holds, or a source that changed" : strerror(-rc));
    return 0;
}
