/* Where checkpoint files live: a local directory or a remote one (an http index, an S3 prefix,
 * a Hub repo). Directory formats ask here instead of stat/realpath/opendir, so every layout
 * opens from every place. */
#ifndef CKPT_PLACE_H
#define CKPT_PLACE_H

#include <stdbool.h>
#include <stddef.h>

enum { PLACE_MISSING, PLACE_FILE, PLACE_DIR, PLACE_OTHER };

/* What path names, following symlinks. */
int place_kind(const char *path);
/* realpath() for a local path, "." and ".." resolved for a URL; 0 or a negative errno. out has
 * room for PATH_MAX bytes. */
int place_resolve(const char *path, char *out);

typedef struct place_entry {
    char *name;
    int kind; /* PLACE_FILE, PLACE_DIR or PLACE_OTHER */
} place_entry;
/* The entries of dir (without . and ..), unsorted. 0 or a negative errno. */
int place_list(const char *dir, place_entry **out, size_t *n);
void place_list_free(place_entry *e, size_t n);
/* Hints that these files will be opened next: remote ones are opened in parallel now. */
void place_warm(const char *const *paths, size_t n);

#endif
