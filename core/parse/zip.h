/* A minimal read-only zip reader for checkpoint containers (torch.save archives, and the torch
 * archives concatenated inside DCP .distcp files). It reads the central directory of a zip that
 * occupies the byte range [base, base+length) of a catalog source — offsets inside the zip are
 * relative to base — and serves STORED records straight from file offsets. It never inflates:
 * checkpoint writers store records uncompressed so that tensors can be mapped, and a compressed
 * record is reported to the caller, who refuses it by name. */
#ifndef CKPT_ZIP_H
#define CKPT_ZIP_H

#include "../model/catalog.h"
#include "../util/hashmap.h"

enum { ZIP_STORED = 0 };

typedef struct zip_entry {
    const char *name; /* not NUL-terminated: use name_len */
    size_t name_len;
    uint16_t flags;
    uint16_t method;
    uint32_t crc;
    uint64_t csize, usize;
    uint64_t local_offset;   /* of its local header, relative to the zip's base */
    uint64_t central_offset; /* of its central header, relative to the zip's base */
} zip_entry;

typedef struct zip_archive {
    const ckpt_catalog *cat;
    uint32_t source;
    uint64_t base, length;
    const char *label; /* how messages name the zip: the file path, or "path [offset N]" */
    zip_entry *entries;
    size_t count;
    char *directory; /* the central directory bytes the entry names point into */
    hashmap by_name;
} zip_archive;

/* Reads the central directory of the zip at [base, base+length) of the source. label names the
 * zip in messages (NULL = the source's path) and must outlive the archive. Every count, size and
 * offset is checked against the range; names must be unique. */
int zip_open(zip_archive *z, const ckpt_catalog *cat, uint32_t source, uint64_t base,
             uint64_t length, const char *label, ckpt_err *err);
void zip_close(zip_archive *z);

/* The entry with exactly this name, or NULL. */
const zip_entry *zip_find(const zip_archive *z, const char *name, size_t len);

/* Absolute file offset of a STORED, unencrypted entry's bytes, taken from its local header and
 * checked to lie inside the zip's range. A compressed or encrypted entry is refused by name. */
int zip_data_offset(const zip_archive *z, const zip_entry *e, uint64_t *offset, ckpt_err *err);

/* Reads a whole STORED entry of at most `limit` bytes into a malloc'd buffer (NUL-terminated
 * for convenience; *len excludes the NUL). */
int zip_read(const zip_archive *z, const zip_entry *e, uint64_t limit, char **data, size_t *len,
             ckpt_err *err);
/* The same for a record that may be big (a pickle): from 1 MiB on it is read into a mapping
 * of its own, so that freeing it (zip_unmap, whatever its size) gives its pages back at once
 * instead of leaving a hole in the heap below what is allocated next. */
int zip_map(const zip_archive *z, const zip_entry *e, uint64_t limit, char **data, size_t *len,
            ckpt_err *err);
void zip_unmap(char *data, size_t len);

#endif
