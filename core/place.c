#include "place.h"
#include "remote/remote.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int place_kind(const char *path) {
    if (remote_is_url(path)) {
        int k = remote_kind(path);
        return k == REMOTE_FILE ? PLACE_FILE : k == REMOTE_DIR ? PLACE_DIR : PLACE_MISSING;
    }
    struct stat st;
    if (stat(path, &st) != 0) return PLACE_MISSING;
    return S_ISREG(st.st_mode) ? PLACE_FILE : S_ISDIR(st.st_mode) ? PLACE_DIR : PLACE_OTHER;
}

int place_resolve(const char *path, char *out) {
    if (remote_is_url(path)) return remote_normalize(path, out, PATH_MAX);
    return realpath(path, out) ? 0 : -errno;
}

static int push(place_entry **e, size_t *n, size_t *cap, const char *name, int kind) {
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 32;
        place_entry *p = realloc(*e, c * sizeof *p);
        if (!p) return -ENOMEM;
        *e = p;
        *cap = c;
    }
    if (!((*e)[*n].name = strdup(name))) return -ENOMEM;
    (*e)[*n].kind = kind;
    (*n)++;
    return 0;
}

int place_list(const char *dir, place_entry **out, size_t *count) {
    *out = NULL;
    *count = 0;
    place_entry *e = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    if (remote_is_url(dir)) {
        const remote_entry *re;
        size_t rn;
        ckpt_err err;
        if ((rc = remote_list(dir, &re, &rn, &err))) return rc;
        for (size_t i = 0; i < rn && !rc; i++)
            rc = push(&e, &n, &cap, re[i].name, re[i].dir ? PLACE_DIR : PLACE_FILE);
    } else {
        DIR *d = opendir(dir);
        if (!d) return -errno;
        struct dirent *de;
        while (!rc && (de = readdir(d))) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
            char path[PATH_MAX];
            int w = snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            int kind = w > 0 && w < (int)sizeof path ? place_kind(path) : PLACE_OTHER;
            if (kind == PLACE_MISSING) kind = PLACE_OTHER; /* a dangling symlink */
            rc = push(&e, &n, &cap, de->d_name, kind);
        }
        closedir(d);
    }
    if (rc) {
        place_list_free(e, n);
        return rc;
    }
    *out = e;
    *count = n;
    return 0;
}

void place_list_free(place_entry *e, size_t n) {
    for (size_t i = 0; i < n; i++) free(e[i].name);
    free(e);
}

void place_warm(const char *const *paths, size_t n) {
    if (n && remote_is_url(paths[0])) remote_warm(paths, n);
}
