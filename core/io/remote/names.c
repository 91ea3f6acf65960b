/* Names of remote places: what kind of thing a name is and what a directory holds (listings
 * cached for the life of the process: a mount pins what it saw). What a name shows and what URL
 * it requests: targets.c. */
#include "remote.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t names_lock = PTHREAD_MUTEX_INITIALIZER; /* the listing cache */

/* ---- paths ---- */

/* Length of scheme://authority (the part ".." never climbs above). */
static size_t root_len(const char *p) {
    const char *s = strstr(p, "://");
    if (!s) return 0;
    s += 3;
    return (size_t)(s - p) + strcspn(s, "/");
}

int remote_normalize(const char *path, char *out, size_t cap) {
    size_t r = root_len(path);
    if (r + 1 >= cap) return -ENAMETOOLONG;
    memcpy(out, path, r);
    size_t o = r;
    const char *p = path + r;
    while (*p) {
        while (*p == '/') p++;
        size_t n = strcspn(p, "/");
        if (n == 0) break;
        if (n == 1 && p[0] == '.') {
        } else if (n == 2 && p[0] == '.' && p[1] == '.') {
            while (o > r && out[o - 1] != '/') o--;
            if (o > r) o--;
        } else {
            if (o + 1 + n + 1 > cap) return -ENAMETOOLONG;
            out[o++] = '/';
            memcpy(out + o, p, n);
            o += n;
        }
        p += n;
    }
    out[o] = 0;
    return 0;
}

/* Lists dir/ of a name given with its trailing slash, where the scheme says that names a
 * directory (remote_scheme.slash_names_dir): remote_kind then knows it is one. A failure is
 * cached too, and remote_kind asks the usual way. */
static void list_named_dir(const remote_scheme *sc, const char *path, const char *norm) {
    size_t n = strcspn(path, "?#");
    if (!sc || !sc->slash_names_dir || n == 0 || path[n - 1] != '/' ||
        strlen(norm) == root_len(norm))
        return;
    const remote_entry *e;
    size_t count;
    ckpt_err err;
    remote_list(norm, &e, &count, &err);
}

int remote_pin(const char *path, char *out, size_t cap, ckpt_err *err) {
    const remote_scheme *sc = remote_scheme_of(path);
    if (sc && sc->pin) return sc->pin(path, out, cap, err);
    if (remote_normalize(path, out, cap) != 0)
        return ckpt_fail(err, -ENAMETOOLONG, "%s: name too long", path);
    list_named_dir(sc, path, out);
    return 0;
}

/* ---- listings ---- */

typedef struct listing {
    char *dir;
    remote_entry *e;
    size_t n;
    int rc;
    char msg[512]; /* why it failed, told again to every later caller */
    struct listing *next;
} listing;

static listing *listings;

static int entry_cmp(const void *a, const void *b) {
    return strcmp(((const remote_entry *)a)->name, ((const remote_entry *)b)->name);
}

int remote_list(const char *dir, const remote_entry **out, size_t *n, ckpt_err *err) {
    *out = NULL;
    *n = 0;
    pthread_mutex_lock(&names_lock);
    for (listing *l = listings; l; l = l->next)
        if (strcmp(l->dir, dir) == 0) {
            pthread_mutex_unlock(&names_lock);
            if (l->rc) return ckpt_fail(err, l->rc, "%s", l->msg);
            *out = l->e;
            *n = l->n;
            return 0;
        }
    pthread_mutex_unlock(&names_lock);
    remote_entry *e = NULL;
    size_t cnt = 0;
    ckpt_err mine;
    if (!err) err = &mine;
    err->msg[0] = 0;
    const remote_scheme *sc = remote_scheme_of(dir);
    int rc = sc ? sc->list(dir, &e, &cnt, err)
                : ckpt_fail(err, -EINVAL, "%s: not a remote name (http://, https://, s3://, hf://)",
                            dir);
    if (cnt > 1) qsort(e, cnt, sizeof *e, entry_cmp);
    listing *l = calloc(1, sizeof *l);
    if (!l || !(l->dir = strdup(dir))) {
        free(l);
        for (size_t i = 0; i < cnt; i++) free(e[i].name);
        free(e);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    l->e = e;
    l->n = cnt;
    l->rc = rc;
    if (rc) snprintf(l->msg, sizeof l->msg, "%s", err->msg[0] ? err->msg : "cannot list it");
    pthread_mutex_lock(&names_lock);
    l->next = listings;
    listings = l;
    pthread_mutex_unlock(&names_lock);
    if (rc) return rc;
    *out = e;
    *n = cnt;
    return 0;
}

static bool listed(const char *dir) {
    pthread_mutex_lock(&names_lock);
    bool found = false;
    for (listing *l = listings; l && !found; l = l->next)
        found = strcmp(l->dir, dir) == 0 && !l->rc;
    pthread_mutex_unlock(&names_lock);
    return found;
}

static int find_entry(const remote_entry *e, size_t n, const char *name) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(e[mid].name, name);
        if (c == 0) return e[mid].dir ? REMOTE_DIR : REMOTE_FILE;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return REMOTE_MISSING;
}

/* A directory is listed once known to be one: listed already, or a directory entry of a listed
 * parent. A single file's parent may not be listable at all (http), or be a whole bucket (s3). */
static bool dir_known(const char *dir) {
    if (listed(dir)) return true;
    const char *slash = strrchr(dir, '/');
    if (!slash || (size_t)(slash - dir) < root_len(dir)) return false;
    char parent[4096];
    size_t pl = (size_t)(slash - dir);
    if (pl >= sizeof parent) return false;
    memcpy(parent, dir, pl);
    parent[pl] = 0;
    if (!listed(parent)) return false;
    const remote_entry *e;
    size_t n;
    ckpt_err err;
    return remote_list(parent, &e, &n, &err) == 0 && find_entry(e, n, slash + 1) == REMOTE_DIR;
}

/* How many components follow scheme://authority in a normalized name ("/a/b": 2). */
static size_t depth(const char *norm, size_t root) {
    size_t n = 0;
    for (const char *p = norm + root; *p; p++) n += *p == '/';
    return n;
}

int remote_kind(const char *path) {
    char norm[4096];
    const remote_scheme *sc = remote_scheme_of(path);
    if (!sc || remote_normalize(path, norm, sizeof norm) != 0) return REMOTE_MISSING;
    size_t r = root_len(norm);
    const remote_entry *e;
    size_t n;
    ckpt_err err;
    /* a bucket, a Hub repo (ORG/NAME@REV) */
    if (sc->top_dirs >= 0 && depth(norm, r) <= (size_t)sc->top_dirs) return REMOTE_DIR;
    /* Listed already (a name with its trailing slash, see list_named_dir). */
    if (listed(norm)) return REMOTE_DIR;
    if (strlen(norm) == r) { /* a server's top: a file or an index page */
        int k = sc->kind ? sc->kind(norm) : REMOTE_MISSING;
        if (k == REMOTE_DIR) remote_list(norm, &e, &n, &err);
        return k < 0 ? REMOTE_MISSING : k;
    }
    char *slash = strrchr(norm, '/');
    const char *name = slash + 1;
    char parent[4096];
    size_t pl = (size_t)(slash - norm);
    memcpy(parent, norm, pl);
    parent[pl] = 0;
    if (sc->kind && !dir_known(parent)) {
        int k = sc->kind(norm);
        if (k == REMOTE_DIR) remote_list(norm, &e, &n, &err); /* its children are asked next */
        if (k >= 0) return k;
    }
    if (remote_list(parent, &e, &n, &err) != 0)
        return sc->partial_listings ? sc->kind(norm) : REMOTE_MISSING;
    int k = find_entry(e, n, name);
    /* Index pages often leave out dot files (nginx does): ask for those directly. */
    if (k == REMOTE_MISSING && sc->partial_listings && name[0] == '.') k = sc->kind(norm);
    return k;
}
