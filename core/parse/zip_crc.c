#include "zip_crc.h"

#include "zip.h"

#include <errno.h>
#include <string.h>
#include <zlib.h>

static bool starts_like_zip(const ckpt_source *s) {
    unsigned char magic[4];
    return s->size >= 4 && ckpt_source_pread(s, magic, 4, 0) == 4 &&
           memcmp(magic, "PK\x03\x04", 4) == 0;
}

static int crc_of(const ckpt_source *s, uint64_t off, uint64_t len, void *buf, size_t bufsize,
                  uint32_t *out, ckpt_err *err) {
    uLong crc = crc32(0L, Z_NULL, 0);
    while (len) {
        size_t want = len < bufsize ? (size_t)len : bufsize;
        ssize_t got = ckpt_source_pread(s, buf, want, off);
        if (got <= 0)
            return ckpt_fail(err, got < 0 ? (int)got : -EIO, "%s: reading offset %llu: %s", s->path,
                             (unsigned long long)off,
                             got < 0 ? strerror((int)-got) : "unexpected end of file");
        crc = crc32(crc, buf, (uInt)got);
        off += (uint64_t)got;
        len -= (uint64_t)got;
    }
    *out = (uint32_t)crc;
    return 0;
}

static long long check_zip(const ckpt_catalog *cat, uint32_t source, ckpt_crc_report report,
                           void *ctx, void *buf, size_t bufsize, ckpt_err *err) {
    const ckpt_source *s = &cat->sources[source];
    zip_archive z;
    int rc = zip_open(&z, cat, source, 0, s->size, NULL, err);
    if (rc) return strcmp(cat->format, "torch-zip") == 0 ? rc : 0;
    long long checked = 0;
    for (size_t i = 0; i < z.count && rc == 0; i++) {
        const zip_entry *e = &z.entries[i];
        uint64_t off;
        /* Compressed records are refused by name when read; there is nothing to hash here. */
        if (e->method != ZIP_STORED || (e->flags & 1) || e->csize != e->usize) continue;
        if ((rc = zip_data_offset(&z, e, &off, err))) break;
        uint32_t crc = 0;
        if ((rc = crc_of(s, off, e->usize, buf, bufsize, &crc, err))) break;
        checked++;
        if (crc != e->crc) {
            ckpt_crc_fault f = {.source = source,
                                .record = e->name,
                                .record_len = e->name_len,
                                .offset = off,
                                .length = e->usize,
                                .stored = e->crc,
                                .computed = crc};
            report(ctx, &f);
        }
    }
    zip_close(&z);
    return rc ? rc : checked;
}

long long ckpt_zip_check_crcs(const ckpt_catalog *cat, ckpt_crc_report report, void *ctx, void *buf,
                              size_t bufsize, ckpt_err *err) {
    long long checked = 0;
    for (uint32_t i = 0; i < cat->nsources; i++) {
        if (!starts_like_zip(&cat->sources[i])) continue;
        long long n = check_zip(cat, i, report, ctx, buf, bufsize, err);
        if (n < 0) return n;
        checked += n;
    }
    return checked;
}
