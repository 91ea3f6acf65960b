/* Manifests for `ckptfs verify`: {"tensors": [{"name", "sha256", "nbytes"}, ...]}, the keys the
 * fixture generators write (other members are ignored); a bare array of entries is accepted
 * too. Names are unique only within a prefix (the directory a catalog shows a tensor under),
 * so an entry may say "prefix" (null or absent = unprefixed or whichever fits) and "path" (the
 * tree path), which pick between tensors of the same name. */
#ifndef CKPTFS_CLI_MANIFEST_H
#define CKPTFS_CLI_MANIFEST_H

#include "core/ckpt.h"
#include "core/util/json.h"
#include "core/util/sha256.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct manifest_entry {
    const char *name; /* points into the parsed document */
    size_t name_len;
    const char *prefix; /* NULL: not given */
    size_t prefix_len;
    const char *path; /* NULL: not given */
    size_t path_len;
    bool has_sha256;                 /* false: "sha256": null (a tensor with holes has no digest) */
    char sha256[SHA256_HEX_LEN + 1]; /* lower case */
    bool has_nbytes;
    uint64_t nbytes;
    size_t pos;    /* byte offset of the entry, for messages */
    size_t tensor; /* the catalog tensor it names, SIZE_MAX when none */
} manifest_entry;

typedef struct manifest {
    const char *path;
    char *text;
    json_doc doc;
    bool parsed;
    manifest_entry *entries;
    size_t n;
} manifest;

/* Reads and checks a manifest. Returns 0, or CLI_SOURCE after printing one line naming the
 * file, the field and the byte offset. */
int manifest_load(manifest *m, const char *path, const char *cmd);
/* Finds each entry's tensor and fills by_tensor[i] (entry index, SIZE_MAX when no entry names
 * tensor i). Two entries naming one tensor are an error (CLI_SOURCE, printed). */
int manifest_match(manifest *m, const ckpt_catalog *cat, size_t *by_tensor, const char *cmd);
void manifest_free(manifest *m);

/* Writes text to path through a temporary file in the same directory, fsynced and renamed, so
 * a reader never sees half a manifest. Returns 0 or CLI_OUTPUT after printing why. */
int manifest_write_file(const char *path, const char *text, size_t len, const char *cmd);

#endif
