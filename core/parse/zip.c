/* Read-only zip central-directory reader over a byte range of a source (see zip.h).
 *
 * Layout facts (APPNOTE.TXT): the end-of-central-directory record (EOCD, 22 bytes + comment)
 * closes the zip; when a zip64 locator (20 bytes) sits right before it, the zip64 EOCD it
 * points to holds the real entry count, directory size and offset. Central headers carry the
 * real sizes (torch's writer leaves the local ones 0 and uses data descriptors), and values
 * 0xFFFFFFFF are replaced by the zip64 extra field (id 0x0001). A record's bytes start after its
 * LOCAL header, whose extra field differs from the central one (torch pads it to align data). */
#include "zip.h"
#include "../util/le.h"

#include "../model/catalog.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

enum {
    EOCD_SIZE = 22,
    EOCD_SIG = 0x06054b50,
    LOCATOR_SIZE = 20,
    LOCATOR_SIG = 0x07064b50,
    EOCD64_SIZE = 56,
    EOCD64_SIG = 0x06064b50,
    CENTRAL_SIZE = 46,
    CENTRAL_SIG = 0x02014b50,
    LOCAL_SIZE = 30,
    LOCAL_SIG = 0x04034b50,
    MAX_COMMENT = 65535,
    FLAG_ENCRYPTED = 1,
};

/* The central directory is read into memory; a torch file needs ~60 bytes per storage. */
#define DIRECTORY_LIMIT (1ull << 30)

#define ABS(z, rel) ((unsigned long long)((z)->base + (rel)))

static int zread(const zip_archive *z, uint64_t rel, void *buf, size_t len, const char *what,
                 ckpt_err *err) {
    if (rel > z->length || len > z->length - rel)
        return ckpt_fail(
            err, -EINVAL,
            "%s: %s at offset %llu (%zu bytes) runs past the end of the zip (size %llu)", z->label,
            what, ABS(z, rel), len, (unsigned long long)z->length);
    return ckpt_source_read(z->cat, z->source, z->base + rel, buf, len, what, err);
}

typedef struct directory_loc {
    uint64_t entries, size, offset;
    uint64_t end; /* where the directory must end: the (zip64) EOCD */
} directory_loc;

/* Finds the EOCD: the last signature whose comment length reaches exactly the end. */
static int find_eocd(const zip_archive *z, uint64_t *eocd, unsigned char rec[EOCD_SIZE],
                     ckpt_err *err) {
    if (z->length < EOCD_SIZE)
        return ckpt_fail(err, -EINVAL,
                         "%s: end of central directory record: the zip is %llu bytes, fewer "
                         "than the %d of the record (truncated) at offset %llu",
                         z->label, (unsigned long long)z->length, EOCD_SIZE, ABS(z, 0));
    size_t tail = z->length < EOCD_SIZE + MAX_COMMENT ? (size_t)z->length : EOCD_SIZE + MAX_COMMENT;
    unsigned char *buf = malloc(tail);
    if (!buf) return ckpt_fail(err, -ENOMEM, "out of memory");
    uint64_t start = z->length - tail;
    int rc = zread(z, start, buf, tail, "end of central directory record", err);
    if (rc) {
        free(buf);
        return rc;
    }
    for (size_t i = tail - EOCD_SIZE + 1; i-- > 0;) {
        if (le32(buf + i) == EOCD_SIG && i + EOCD_SIZE + le16(buf + i + 20) == tail) {
            memcpy(rec, buf + i, EOCD_SIZE);
            *eocd = start + i;
            free(buf);
            return 0;
        }
    }
    free(buf);
    return ckpt_fail(err, -EINVAL,
                     "%s: end of central directory record not found in the last %zu bytes "
                     "before offset %llu (truncated, or not a zip)",
                     z->label, tail, ABS(z, z->length));
}

static int read_zip64_eocd(const zip_archive *z, uint64_t eocd, directory_loc *loc, ckpt_err *err) {
    unsigned char lrec[LOCATOR_SIZE] = {0}, rec[EOCD64_SIZE] = {0};
    int rc = zread(z, eocd - LOCATOR_SIZE, lrec, LOCATOR_SIZE, "zip64 locator", err);
    if (rc) return rc;
    uint64_t at = le64(lrec + 8);
    if (le32(lrec + 4) != 0 || le32(lrec + 16) > 1)
        return ckpt_fail(err, -EINVAL,
                         "%s: zip64 locator at offset %llu describes a multi-disk zip", z->label,
                         ABS(z, eocd - LOCATOR_SIZE));
    if (at > eocd - LOCATOR_SIZE || eocd - LOCATOR_SIZE - at < EOCD64_SIZE)
        return ckpt_fail(err, -EINVAL,
                         "%s: zip64 locator at offset %llu points to offset %llu, where no "
                         "zip64 end of central directory record fits",
                         z->label, ABS(z, eocd - LOCATOR_SIZE), ABS(z, at));
    if ((rc = zread(z, at, rec, EOCD64_SIZE, "zip64 end of central directory record", err)))
        return rc;
    if (le32(rec) != EOCD64_SIG)
        return ckpt_fail(err, -EINVAL,
                         "%s: zip64 end of central directory record at offset %llu has a bad "
                         "signature",
                         z->label, ABS(z, at));
    if (le32(rec + 16) != 0 || le32(rec + 20) != 0 || le64(rec + 24) != le64(rec + 32))
        return ckpt_fail(err, -EINVAL,
                         "%s: zip64 end of central directory record at offset %llu describes a "
                         "multi-disk zip",
                         z->label, ABS(z, at));
    loc->entries = le64(rec + 32);
    loc->size = le64(rec + 40);
    loc->offset = le64(rec + 48);
    loc->end = at;
    return 0;
}

static int locate_directory(const zip_archive *z, directory_loc *loc, ckpt_err *err) {
    unsigned char rec[EOCD_SIZE] = {0};
    uint64_t eocd = 0;
    int rc = find_eocd(z, &eocd, rec, err);
    if (rc) return rc;
    if (le16(rec + 4) != 0 || le16(rec + 6) != 0 || le16(rec + 8) != le16(rec + 10))
        return ckpt_fail(err, -EINVAL,
                         "%s: end of central directory record at offset %llu describes a "
                         "multi-disk zip",
                         z->label, ABS(z, eocd));
    loc->entries = le16(rec + 10);
    loc->size = le32(rec + 12);
    loc->offset = le32(rec + 16);
    loc->end = eocd;
    if (eocd >= LOCATOR_SIZE) {
        unsigned char sig[4] = {0};
        if ((rc = zread(z, eocd - LOCATOR_SIZE, sig, 4, "zip64 locator", err))) return rc;
        if (le32(sig) == LOCATOR_SIG && (rc = read_zip64_eocd(z, eocd, loc, err))) return rc;
    }
    if (loc->offset > loc->end || loc->size > loc->end - loc->offset)
        return ckpt_fail(err, -EINVAL,
                         "%s: central directory offset %llu + size %llu runs past its end record "
                         "at offset %llu",
                         z->label, ABS(z, loc->offset), (unsigned long long)loc->size,
                         ABS(z, loc->end));
    if (loc->entries > loc->size / CENTRAL_SIZE)
        return ckpt_fail(err, -EINVAL,
                         "%s: central directory entry count %llu cannot fit in its %llu bytes at "
                         "offset %llu",
                         z->label, (unsigned long long)loc->entries, (unsigned long long)loc->size,
                         ABS(z, loc->offset));
    if (loc->size > DIRECTORY_LIMIT)
        return ckpt_fail(err, -EFBIG,
                         "%s: central directory size %llu at offset %llu exceeds the limit of "
                         "%llu bytes",
                         z->label, (unsigned long long)loc->size, ABS(z, loc->offset),
                         (unsigned long long)DIRECTORY_LIMIT);
    return 0;
}

/* Fills the fields the zip64 extra field (id 1) replaces: each present only when the header
 * holds the 0xFFFFFFFF marker, in the order uncompressed size, compressed size, offset. */
static int apply_zip64_extra(const zip_archive *z, zip_entry *e, const unsigned char *x,
                             size_t xlen, uint64_t at, ckpt_err *err) {
    bool need_u = e->usize == 0xFFFFFFFFu, need_c = e->csize == 0xFFFFFFFFu,
         need_o = e->local_offset == 0xFFFFFFFFu;
    if (!need_u && !need_c && !need_o) return 0;
    for (size_t i = 0; i + 4 <= xlen;) {
        uint16_t id = le16(x + i), n = le16(x + i + 2);
        if (n > xlen - i - 4) break;
        if (id == 1) {
            const unsigned char *p = x + i + 4;
            size_t want = 8u * (need_u + need_c + need_o);
            if (n < want) break;
            if (need_u) e->usize = le64(p), p += 8;
            if (need_c) e->csize = le64(p), p += 8;
            if (need_o) e->local_offset = le64(p);
            return 0;
        }
        i += 4 + (size_t)n;
    }
    return ckpt_fail(err, -EINVAL,
                     "%s: central directory entry \"%.*s\" at offset %llu has 0xFFFFFFFF sizes or "
                     "offset but no complete zip64 extra field",
                     z->label, SHOWN_NAME(e->name, e->name_len), ABS(z, at));
}

static int parse_directory(zip_archive *z, const directory_loc *loc, ckpt_err *err) {
    const unsigned char *d = (const unsigned char *)z->directory;
    uint64_t pos = 0;
    for (size_t i = 0; i < z->count; i++) {
        uint64_t at = loc->offset + pos;
        if (loc->size - pos < CENTRAL_SIZE)
            return ckpt_fail(err, -EINVAL,
                             "%s: central directory entry %zu at offset %llu runs past the end of "
                             "the directory (%llu entries declared)",
                             z->label, i, ABS(z, at), (unsigned long long)loc->entries);
        const unsigned char *h = d + pos;
        if (le32(h) != CENTRAL_SIG)
            return ckpt_fail(err, -EINVAL,
                             "%s: central directory entry %zu at offset %llu has a bad signature",
                             z->label, i, ABS(z, at));
        size_t nlen = le16(h + 28), xlen = le16(h + 30), clen = le16(h + 32);
        if (loc->size - pos - CENTRAL_SIZE < nlen + xlen + clen)
            return ckpt_fail(err, -EINVAL,
                             "%s: central directory entry %zu at offset %llu: name and extra "
                             "fields run past the end of the directory",
                             z->label, i, ABS(z, at));
        zip_entry *e = &z->entries[i];
        e->name = (const char *)h + CENTRAL_SIZE;
        e->name_len = nlen;
        e->flags = le16(h + 8);
        e->method = le16(h + 10);
        e->crc = le32(h + 16);
        e->csize = le32(h + 20);
        e->usize = le32(h + 24);
        e->local_offset = le32(h + 42);
        e->central_offset = at;
        if (le16(h + 34) != 0 && le16(h + 34) != 0xFFFF)
            return ckpt_fail(err, -EINVAL,
                             "%s: central directory entry \"%.*s\" at offset %llu starts on disk "
                             "%u (multi-disk zip)",
                             z->label, SHOWN_NAME(e->name, nlen), ABS(z, at), le16(h + 34));
        int rc = apply_zip64_extra(z, e, h + CENTRAL_SIZE + nlen, xlen, at, err);
        if (rc) return rc;
        if (e->local_offset > z->length || z->length - e->local_offset < LOCAL_SIZE)
            return ckpt_fail(err, -EINVAL,
                             "%s: record \"%.*s\": local header offset %llu (central directory "
                             "entry at offset %llu) runs past the end of the zip (size %llu)",
                             z->label, SHOWN_NAME(e->name, nlen), ABS(z, e->local_offset),
                             ABS(z, at), (unsigned long long)z->length);
        bool added;
        hm_entry *he = hm_put(&z->by_name, e->name, nlen, i, &added);
        if (!he) return ckpt_fail(err, -ENOMEM, "out of memory");
        if (!added)
            return ckpt_fail(err, -EINVAL,
                             "%s: record name \"%.*s\" appears twice in the central directory "
                             "(second at offset %llu)",
                             z->label, SHOWN_NAME(e->name, nlen), ABS(z, at));
        pos += CENTRAL_SIZE + nlen + xlen + clen;
    }
    return 0;
}

int zip_open(zip_archive *z, const ckpt_catalog *cat, uint32_t source, uint64_t base,
             uint64_t length, const char *label, ckpt_err *err) {
    memset(z, 0, sizeof *z);
    z->cat = cat;
    z->source = source;
    z->base = base;
    z->length = length;
    z->label = label ? label : cat->sources[source].path;
    uint64_t size = cat->sources[source].size;
    if (base > size || length > size - base)
        return ckpt_fail(
            err, -EINVAL,
            "%s: zip range at offset %llu (%llu bytes) runs past the end of the file (size %llu)",
            z->label, (unsigned long long)base, (unsigned long long)length,
            (unsigned long long)size);
    directory_loc loc = {0};
    int rc = locate_directory(z, &loc, err);
    if (rc) return rc;
    z->count = (size_t)loc.entries;
    z->directory = malloc(loc.size ? (size_t)loc.size : 1);
    z->entries = calloc(z->count ? z->count : 1, sizeof *z->entries);
    if (!z->directory || !z->entries || !hm_init(&z->by_name, z->count)) {
        zip_close(z);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    rc = zread(z, loc.offset, z->directory, (size_t)loc.size, "central directory", err);
    if (!rc) rc = parse_directory(z, &loc, err);
    if (rc) zip_close(z);
    return rc;
}

void zip_close(zip_archive *z) {
    free(z->directory);
    free(z->entries);
    hm_free(&z->by_name);
    z->directory = NULL;
    z->entries = NULL;
    z->count = 0;
}

const zip_entry *zip_find(const zip_archive *z, const char *name, size_t len) {
    const hm_entry *h = hm_get(&z->by_name, name, len);
    return h ? &z->entries[h->value] : NULL;
}

static const char *method_name(uint16_t m) {
    switch (m) {
    case 8:
        return "deflate";
    case 9:
        return "deflate64";
    case 12:
        return "bzip2";
    case 14:
        return "lzma";
    case 93:
        return "zstd";
    case 95:
        return "xz";
    default:
        return "unknown";
    }
}

int zip_data_offset(const zip_archive *z, const zip_entry *e, uint64_t *offset, ckpt_err *err) {
    if (e->method != ZIP_STORED)
        return ckpt_fail(err, -ENOTSUP,
                         "%s: record \"%.*s\" (central directory entry at offset %llu) is "
                         "compressed with method %u (%s); only stored (uncompressed) records can "
                         "be served from the file",
                         z->label, SHOWN_NAME(e->name, e->name_len), ABS(z, e->central_offset),
                         e->method, method_name(e->method));
    if (e->flags & FLAG_ENCRYPTED)
        return ckpt_fail(err, -ENOTSUP,
                         "%s: record \"%.*s\" (central directory entry at offset %llu) is "
                         "encrypted",
                         z->label, SHOWN_NAME(e->name, e->name_len), ABS(z, e->central_offset));
    if (e->csize != e->usize)
        return ckpt_fail(err, -EINVAL,
                         "%s: record \"%.*s\" (central directory entry at offset %llu) is stored "
                         "but its compressed size %llu differs from its size %llu",
                         z->label, SHOWN_NAME(e->name, e->name_len), ABS(z, e->central_offset),
                         (unsigned long long)e->csize, (unsigned long long)e->usize);
    unsigned char h[LOCAL_SIZE + 65535];
    size_t want = LOCAL_SIZE + e->name_len;
    uint64_t avail = z->length - e->local_offset; /* >= LOCAL_SIZE, checked by zip_open */
    int rc = zread(z, e->local_offset, h, want <= avail ? want : LOCAL_SIZE, "local header", err);
    if (rc) return rc;
    if (le32(h) != LOCAL_SIG)
        return ckpt_fail(err, -EINVAL,
                         "%s: record \"%.*s\": local header at offset %llu has a bad signature",
                         z->label, SHOWN_NAME(e->name, e->name_len), ABS(z, e->local_offset));
    size_t nlen = le16(h + 26), xlen = le16(h + 28);
    if (nlen != e->name_len || want > avail || memcmp(h + LOCAL_SIZE, e->name, nlen) != 0)
        return ckpt_fail(err, -EINVAL,
                         "%s: record \"%.*s\": local header at offset %llu names a different "
                         "record than the central directory",
                         z->label, SHOWN_NAME(e->name, e->name_len), ABS(z, e->local_offset));
    uint64_t data = e->local_offset + LOCAL_SIZE + nlen + xlen;
    if (data > z->length || e->usize > z->length - data)
        return ckpt_fail(err, -EINVAL,
                         "%s: record \"%.*s\": %llu bytes at offset %llu (local header at offset "
                         "%llu) run past the end of the zip (size %llu)",
                         z->label, SHOWN_NAME(e->name, e->name_len), (unsigned long long)e->usize,
                         ABS(z, data), ABS(z, e->local_offset), (unsigned long long)z->length);
    *offset = z->base + data;
    return 0;
}

static char *heap_buffer(size_t size) {
    return malloc(size);
}

static void heap_release(char *p, size_t size) {
    (void)size;
    free(p);
}

/* Records from 1 MiB on are mapped; smaller ones (the pickles embedded in DCP shards, one a
 * chunk) come from the heap, which reuses them without a system call. */
enum { MAP_MIN = 1 << 20 };

static char *mapped_buffer(size_t size) {
    if (size < MAP_MIN) return malloc(size);
    char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void mapped_release(char *p, size_t size) {
    if (size < MAP_MIN)
        free(p);
    else
        munmap(p, size);
}

static int read_into(const zip_archive *z, const zip_entry *e, uint64_t limit, char **data,
                     size_t *len, char *(*get)(size_t), void (*put)(char *, size_t),
                     ckpt_err *err) {
    *data = NULL;
    *len = 0;
    uint64_t off = 0;
    int rc = zip_data_offset(z, e, &off, err);
    if (rc) return rc;
    if (e->usize > limit)
        return ckpt_fail(err, -EFBIG,
                         "%s: record \"%.*s\" at offset %llu is %llu bytes, more than the limit of "
                         "%llu",
                         z->label, SHOWN_NAME(e->name, e->name_len), (unsigned long long)off,
                         (unsigned long long)e->usize, (unsigned long long)limit);
    char *buf = get((size_t)e->usize + 1);
    if (!buf) return ckpt_fail(err, -ENOMEM, "out of memory");
    rc = ckpt_source_read(z->cat, z->source, off, buf, (size_t)e->usize, "zip record", err);
    if (rc) {
        put(buf, (size_t)e->usize + 1);
        return rc;
    }
    buf[e->usize] = '\0';
    *data = buf;
    *len = (size_t)e->usize;
    return 0;
}

int zip_read(const zip_archive *z, const zip_entry *e, uint64_t limit, char **data, size_t *len,
             ckpt_err *err) {
    return read_into(z, e, limit, data, len, heap_buffer, heap_release, err);
}

int zip_map(const zip_archive *z, const zip_entry *e, uint64_t limit, char **data, size_t *len,
            ckpt_err *err) {
    return read_into(z, e, limit, data, len, mapped_buffer, mapped_release, err);
}

void zip_unmap(char *data, size_t len) {
    if (data) mapped_release(data, len + 1);
}
