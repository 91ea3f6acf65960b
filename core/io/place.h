/* Where checkpoint files live: a local directory or a remote one (an http index, an S3 prefix,
 * a Hub repo). Directory formats ask here instead of stat/realpath/opendir/open, and open the
 * files they pick as sources (catalog_add_source, read with ckpt_source_pread), so every layout
 * opens from every place: a remote directory is one more kind of place, not another code path.
 * Local paths keep their hardening here: FIFOs and devices are refused without blocking, and
 * symlinks are followed (an HF cache's snapshot links are the user's own). */
#ifndef CKPT_PLACE_H
#define CKPT_PLACE_H

#include "../ckpt.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { PLACE_MISSING, PLACE_FILE, PLACE_DIR, PLACE_OTHER };

/* What path names, following symlinks. */
int place_kind(const char *path);
/* realpath() for a local path, "." and ".." resolved for a URL; 0 or a negative errno. out has
 * room for PATH_MAX bytes. */
int place_resolve(const char *path, char *out);

#define PLACE_SIZE_UNKNOWN UINT64_MAX
typedef struct place_entry {
    char *name;
    int kind;      /* PLACE_FILE, PLACE_DIR or PLACE_OTHER */
    uint64_t size; /* of a file; PLACE_SIZE_UNKNOWN where the listing does not say (http) */
} place_entry;
/* The entries of dir (without . and ..), unsorted. 0 or a negative errno. */
int place_list(const char *dir, place_entry **out, size_t *n);
/* 0 when dir can be listed, else why not (a remote listing refused or failed; local: 0), so a
 * directory that no probe recognised says what went wrong with its listing first. */
int place_list_failure(const char *dir, ckpt_err *err);
void place_list_free(place_entry *e, size_t n);
/* The first bytes of the regular file path: up to cap into buf, *got of them, the file's size
 * in *size (either may be NULL). 0 or a negative errno (-EINVAL: not a regular file). Remote
 * heads are kept, so probing a file again (a directory probe, then its load) costs no request. */
int place_read_head(const char *path, void *buf, size_t cap, size_t *got, uint64_t *size);
/* Hints that these files will be opened next: remote ones are opened in parallel now. */
void place_warm(const char *const *paths, size_t n);

#endif
