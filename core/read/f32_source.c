/* See f32_source.h. Each read converts the whole elements under the bytes asked for, from the
 * entry holding the first byte (callers loop, as for a file); conversions are torch's
 * `Tensor.float()`: floats widened exactly or rounded to nearest (F64), integers and bool as
 * their value. */
#include "f32_source.h"

#include "../model/catalog.h"
#include "../util/search.h"
#include "dequant.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { CHUNK_ELEMS = 4096 }; /* on the reading thread's stack: 48 KiB */

typedef struct entry {
    uint64_t at; /* first byte in the virtual source (searched: the first member) */
    uint64_t numel;
    uint64_t file_offset;
    uint32_t source;
    ckpt_dtype dtype;
} entry;
_Static_assert(offsetof(entry, at) == 0, "entries are searched by their first member");

struct f32_source {
    const ckpt_catalog *cat;
    size_t n, cap;
    uint64_t total;
    entry *e;
};

static _Thread_local char f32_error[sizeof(((ckpt_err *)0)->msg)];

bool f32_source_converts(ckpt_dtype dt) {
    switch (dt) {
    case CKPT_BOOL:
    case CKPT_U8:
    case CKPT_I8:
    case CKPT_U16:
    case CKPT_I16:
    case CKPT_U32:
    case CKPT_I32:
    case CKPT_U64:
    case CKPT_I64:
    case CKPT_F64:
        return true;
    default:
        return ckpt_dtype_elem_size(dt) && ckpt_to_f32_supported(dt) &&
               ckpt_dtype_info_of(dt)->block == 1;
    }
}

f32_source *f32_source_new(const ckpt_catalog *cat, size_t n) {
    f32_source *f = calloc(1, sizeof *f);
    if (!f || !(f->e = calloc(n ? n : 1, sizeof *f->e))) {
        free(f);
        return NULL;
    }
    f->cat = cat;
    f->cap = n;
    return f;
}

int f32_source_add(f32_source *f, uint32_t source, uint64_t file_offset, ckpt_dtype dt,
                   uint64_t numel, uint64_t *at, ckpt_err *err) {
    if (f->n == f->cap || !f32_source_converts(dt))
        return ckpt_fail(err, -EINVAL, "a %s tensor cannot be read as F32",
                         ckpt_dtype_info_of(dt)->name);
    if (numel > (UINT64_MAX - f->total) / 4)
        return ckpt_fail(err, -EOVERFLOW, "%llu elements: too many to read as F32",
                         (unsigned long long)numel);
    f->e[f->n++] = (entry){
        .at = f->total, .numel = numel, .file_offset = file_offset, .source = source, .dtype = dt};
    *at = f->total;
    f->total += numel * 4;
    return 0;
}

static float element(ckpt_dtype dt, const unsigned char *p) {
    uint64_t u = 0;
    size_t esz = ckpt_dtype_elem_size(dt);
    memcpy(&u, p, esz); /* little-endian host, as the rest of the read path */
    switch (dt) {
    case CKPT_BOOL:
        return u ? 1.0f : 0.0f;
    case CKPT_I8:
        return (float)(int8_t)u;
    case CKPT_I16:
        return (float)(int16_t)u;
    case CKPT_I32:
        return (float)(int32_t)u;
    case CKPT_I64:
        return (float)(int64_t)u;
    case CKPT_F64: {
        double d;
        memcpy(&d, &u, 8);
        return (float)d;
    }
    default: /* unsigned */
        return (float)u;
    }
}

/* Up to len bytes at off, all inside the entry that holds off. */
static ssize_t convert_at(const f32_source *f, unsigned char *buf, size_t len, uint64_t off) {
    const entry *e = &f->e[last_at_or_before_in(f->e, sizeof *f->e, f->n, off)];
    uint64_t rel = off - e->at, end = e->numel * 4 - rel < len ? e->numel * 4 : rel + len;
    uint64_t first = rel / 4, count = (end + 3) / 4 - first;
    if (count > CHUNK_ELEMS) count = CHUNK_ELEMS;
    size_t esz = ckpt_dtype_elem_size(e->dtype);
    unsigned char raw[CHUNK_ELEMS * 8];
    float out[CHUNK_ELEMS];
    const ckpt_source *s = &f->cat->sources[e->source];
    size_t want = (size_t)count * esz, got = 0;
    while (got < want) {
        ssize_t r = ckpt_source_pread(s, raw + got, want - got, e->file_offset + first * esz + got);
        if (r <= 0) {
            snprintf(f32_error, sizeof f32_error, "%s: %s at byte %llu", s->relpath,
                     r < 0 ? strerror((int)-r) : "ends early",
                     (unsigned long long)(e->file_offset + first * esz + got));
            return r < 0 ? r : -EIO;
        }
        got += (size_t)r;
    }
    /* the virtual source is taken as unchanged by readers: the stored file is checked here,
     * after the read, as a reader checks a file of its own */
    if (!ckpt_source_unchanged(s)) {
        snprintf(f32_error, sizeof f32_error, "%s changed since it was opened", s->relpath);
        return -EIO;
    }
    if (ckpt_to_f32_supported(e->dtype) && e->dtype != CKPT_F64)
        ckpt_to_f32(e->dtype, raw, (size_t)count, out);
    else
        for (uint64_t i = 0; i < count; i++) out[i] = element(e->dtype, raw + i * esz);
    size_t skip = (size_t)(rel - first * 4);
    size_t give = (size_t)(count * 4 - skip);
    if (give > end - rel) give = (size_t)(end - rel);
    memcpy(buf, (unsigned char *)out + skip, give);
    return (ssize_t)give;
}

static ssize_t f32_pread(void *ctx, void *buf, size_t len, uint64_t off) {
    const f32_source *f = ctx;
    if (off >= f->total || len == 0) return 0;
    return convert_at(f, buf, len, off);
}

static const char *f32_last_error(void) {
    return f32_error[0] ? f32_error : "error while reading as F32";
}

static void f32_release(void *ctx) {
    f32_source *f = ctx;
    if (f) free(f->e);
    free(f);
}

static const ckpt_virtual_ops f32_ops = {f32_pread, f32_last_error, f32_release};

int f32_source_attach(ckpt_catalog *cat, f32_source *f, uint32_t *index, ckpt_err *err) {
    /* the files the bytes come from: no wider access than theirs, their latest change */
    mode_t mode = 07777;
    struct timespec mtime = {0, 0};
    for (size_t i = 0; i < f->n; i++) {
        const ckpt_source *s = &cat->sources[f->e[i].source];
        mode &= s->mode;
        if (s->mtime.tv_sec > mtime.tv_sec ||
            (s->mtime.tv_sec == mtime.tv_sec && s->mtime.tv_nsec > mtime.tv_nsec))
            mtime = s->mtime;
    }
    int rc = catalog_add_virtual_source(cat, "(read as F32)", f->total, &f32_ops, f, index, err);
    if (rc) {
        f32_release(f);
        return rc;
    }
    cat->sources[*index].mode = S_IFREG | mode;
    cat->sources[*index].mtime = mtime;
    return 0;
}
