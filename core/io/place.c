#include "place.h"
#include "remote/remote.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

static int push(place_entry **e, size_t *n, size_t *cap, const char *name, int kind,
                uint64_t size) {
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 32;
        place_entry *p = realloc(*e, c * sizeof *p);
        if (!p) return -ENOMEM;
        *e = p;
        *cap = c;
    }
    if (!((*e)[*n].name = strdup(name))) return -ENOMEM;
    (*e)[*n].kind = kind;
    (*e)[*n].size = size;
    (*n)++;
    return 0;
}

int place_list_failure(const char *dir, ckpt_err *err) {
    if (!remote_is_url(dir)) return 0;
    const remote_entry *re;
    size_t rn;
    return remote_list(dir, &re, &rn, err);
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
            rc = push(&e, &n, &cap, re[i].name, re[i].dir ? PLACE_DIR : PLACE_FILE,
                      re[i].dir ? 0 : re[i].size);
    } else {
        DIR *d = opendir(dir);
        if (!d) return -errno;
        struct dirent *de;
        while (!rc && (de = readdir(d))) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
            /* stat, not lstat: symlinks are followed; a dangling one is PLACE_OTHER. */
            struct stat st;
            int kind = fstatat(dirfd(d), de->d_name, &st, 0) != 0 ? PLACE_OTHER
                       : S_ISREG(st.st_mode)                      ? PLACE_FILE
                       : S_ISDIR(st.st_mode)                      ? PLACE_DIR
                                                                  : PLACE_OTHER;
            rc =
                push(&e, &n, &cap, de->d_name, kind, kind == PLACE_FILE ? (uint64_t)st.st_size : 0);
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

/* ---- first bytes ---- */

enum { HEAD_KEPT = 4096 }; /* what a probe or a small text file (a ref, a tag) needs */

typedef struct kept_head {
    char *path;
    uint64_t size;
    size_t len;
    struct kept_head *next;
    unsigned char bytes[];
} kept_head;

static pthread_mutex_t heads_lock = PTHREAD_MUTEX_INITIALIZER;
static kept_head *heads;

static void answer(const unsigned char *bytes, size_t len, uint64_t file_size, void *buf,
                   size_t cap, size_t *got, uint64_t *size) {
    size_t n = len < cap ? len : cap;
    memcpy(buf, bytes, n);
    if (got) *got = n;
    if (size) *size = file_size;
}

static int remote_head(const char *path, void *buf, size_t cap, size_t *got, uint64_t *size) {
    pthread_mutex_lock(&heads_lock);
    for (kept_head *h = heads; h; h = h->next)
        if (strcmp(h->path, path) == 0 && (cap <= h->len || h->len == h->size)) {
            answer(h->bytes, h->len, h->size, buf, cap, got, size);
            pthread_mutex_unlock(&heads_lock);
            return 0;
        }
    pthread_mutex_unlock(&heads_lock);
    remote_object *o;
    ckpt_err err;
    int rc = remote_open(path, &o, &err);
    if (rc) return rc;
    uint64_t total = remote_size(o);
    size_t want = cap > HEAD_KEPT ? cap : HEAD_KEPT;
    if (total < want) want = (size_t)total;
    kept_head *h = malloc(sizeof *h + want);
    if (!h || !(h->path = strdup(path))) {
        free(h);
        remote_close(o);
        return -ENOMEM;
    }
    size_t done = 0;
    while (done < want && rc == 0) {
        ssize_t r = remote_pread(o, h->bytes + done, want - done, done);
        if (r <= 0)
            rc = r < 0 ? (int)r : -EIO;
        else
            done += (size_t)r;
    }
    remote_close(o);
    if (rc) {
        free(h->path);
        free(h);
        return rc;
    }
    h->size = total;
    h->len = done;
    answer(h->bytes, h->len, h->size, buf, cap, got, size);
    pthread_mutex_lock(&heads_lock);
    h->next = heads;
    heads = h;
    pthread_mutex_unlock(&heads_lock);
    return 0;
}

int place_read_head(const char *path, void *buf, size_t cap, size_t *got, uint64_t *size) {
    if (remote_is_url(path)) return remote_head(path, buf, cap, got, size);
    /* O_NONBLOCK: a FIFO named like a checkpoint must not hold the probe forever; the type is
     * checked on the descriptor, so nothing races between the check and the read. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return -errno;
    struct stat st;
    int rc = fstat(fd, &st) != 0 ? -errno : S_ISREG(st.st_mode) ? 0 : -EINVAL;
    size_t done = 0;
    while (!rc && done < cap) {
        ssize_t r = pread(fd, (char *)buf + done, cap - done, (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) rc = -errno;
        if (r <= 0) break;
        done += (size_t)r;
    }
    close(fd);
    if (rc) return rc;
    if (got) *got = done;
    if (size) *size = (uint64_t)st.st_size;
    return 0;
}

static bool head_kept(const char *path) {
    pthread_mutex_lock(&heads_lock);
    kept_head *h = heads;
    while (h && strcmp(h->path, path) != 0) h = h->next;
    pthread_mutex_unlock(&heads_lock);
    return h != NULL;
}

void place_warm(const char *const *paths, size_t n) {
    if (!n || !remote_is_url(paths[0])) return;
    /* Files whose first bytes are kept already would only be probed from those: an object
     * opened ahead for them would never be taken. */
    const char **todo = malloc(n * sizeof *todo);
    if (!todo) return;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!head_kept(paths[i])) todo[k++] = paths[i];
    remote_warm(todo, k);
    free(todo);
}
