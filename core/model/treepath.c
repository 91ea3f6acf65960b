/* Where each tensor appears in the mounted tree.
 *
 * A name splits on '.' and '/' into directories. Each component is escaped so that every name
 * maps to a distinct, valid path and the mapping can be undone:
 *   '%' -> %25, bytes 0x00-0x1F and 0x7F -> %XX (uppercase hex), an empty component -> %_ ,
 *   a component longer than 224 bytes -> its first 200 bytes + %# + 16 hex digits of a hash.
 * Components never contain '.', so names with a '.' (sidecars "x.json", "x.raw") are ours.
 * Two names with the same path (a.b and a/b): in name order, the 2nd gets "%~2", the 3rd "%~3".
 * A tensor whose path is also a directory (a.b next to a.b.c) is shown as "<path>.raw".
 * Per-rank copies carry a prefix (".ckptfs/ranks/N/") put in front as it is. */
#include "catalog.h"
#include "../util/text.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/strbuf.h"

/* A component is shortened past LONG_NAME bytes, so that with what may follow it — "%~N" for a
 * repeated path (up to 22 bytes) and ".json" — a file name stays within NAME_MAX (255). */
enum { LONG_NAME = 224, LONG_KEEP = 200 };

uint64_t treepath_hash(const char *p, size_t n) {
    /* FNV-1a 64, but with an offset basis a digit short of FNV's (14695981039346656037):
     * shortened paths have always been made with it, so it stays (ckptfs(5) says so). */
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ull;
    }
    return h;
}

void treepath_escape_component(strbuf *sb, const char *p, size_t n) {
    if (n == 0)
        sb_puts(sb, "%_");
    else
        text_pct_escape(sb, p, n, false);
}

/* A component past LONG_NAME bytes is shortened (two names may then share a path). */
static void escape_component(strbuf *sb, const char *p, size_t n) {
    size_t start = sb->len;
    treepath_escape_component(sb, p, n);
    if (sb->failed || sb->len - start <= LONG_NAME) return;
    sb->len = start + LONG_KEEP;
    /* Do not cut an escape in half. */
    for (size_t k = 1; k <= 2; k++)
        if (sb->data[sb->len - k] == '%') sb->len -= k;
    sb_printf(sb, "%%#%016llx", (unsigned long long)treepath_hash(p, n));
}

/* A name holding a '/' (a.b and a/b meet) or a long component may share its path with
 * another name; otherwise escaping is one-to-one. */
static void escape_name(strbuf *sb, const char *name, size_t len) {
    size_t s = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i == len || name[i] == '.' || name[i] == '/') {
            if (s) sb_putc(sb, '/');
            escape_component(sb, name + s, i - s);
            s = i + 1;
        }
    }
}

/* True when escaping would only turn '.' into '/': no byte to escape, no '/', no empty or long
 * component. Most names are like that, and copying them is far cheaper than escaping. */
static bool plain_name(const char *name, size_t len) {
    size_t component = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c == '.') {
            if (component == 0) return false;
            component = 0;
        } else if (c < 0x20 || c == 0x7f || c == '%' || c == '/' || ++component > LONG_NAME) {
            return false;
        }
    }
    return component > 0;
}

/* prefix + name with '.' -> '/', in the arena. */
static char *plain_path(arena *mem, const char *prefix, const char *name, size_t len) {
    size_t plen = prefix ? strlen(prefix) : 0;
    char *p = arena_text(mem, NULL, plen + len); /* filled here */
    if (!p) return NULL;
    if (plen) memcpy(p, prefix, plen);
    for (size_t i = 0; i < len; i++) p[plen + i] = name[i] == '.' ? '/' : name[i];
    p[plen + len] = '\0';
    return p;
}

/* Tensor order[k] (identity when order is NULL). */
static const char *path_at(const ckpt_catalog *cat, const uint32_t *order, size_t k) {
    return cat->tensors[order ? order[k] : k].path;
}

/* By path, then by index: tensors of one path stay in name order. */
static int by_path(const void *a, const void *b, void *ctx) {
    const ckpt_catalog *cat = ctx;
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    int c = strcmp(cat->tensors[x].path, cat->tensors[y].path);
    return c ? c : (x > y) - (x < y);
}

/* The tensors in path order: NULL in *order when they are in it already (plain names are:
 * '.' and '/' are neighbours in ASCII, so turning one into the other keeps the order). 4 bytes
 * a tensor, where maps of every path and every directory took ~170. */
static int sort_by_path(const ckpt_catalog *cat, uint32_t **order) {
    size_t n = cat->ntensors;
    *order = NULL;
    size_t k = 1;
    while (k < n && strcmp(cat->tensors[k - 1].path, cat->tensors[k].path) <= 0) k++;
    if (k >= n) return 0;
    if (n > UINT32_MAX) return -E2BIG;
    uint32_t *o = malloc(n * sizeof *o);
    if (!o) return -ENOMEM;
    for (size_t i = 0; i < n; i++) o[i] = (uint32_t)i;
    qsort_r(o, n, sizeof *o, by_path, (void *)cat);
    *order = o;
    return 0;
}

/* Whether a path in order[from..n) starts with p + '/'. The paths that start with p follow p
 * (the least of them) in one run, so this is settled by the next one mostly. */
static bool has_children(const ckpt_catalog *cat, const uint32_t *order, size_t from, size_t n,
                         const char *p, size_t len) {
    if (from >= n) return false;
    const char *next = path_at(cat, order, from);
    if (strncmp(next, p, len) != 0) return false;
    if (next[len] == '/') return true;
    /* p + a byte below '/' ("a-b" after "a"): find the first path at or past p + '/'. */
    size_t lo = from + 1, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const char *q = path_at(cat, order, mid);
        int c = strncmp(q, p, len);
        if (c == 0) c = (unsigned char)q[len] - '/';
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    const char *q = lo < n ? path_at(cat, order, lo) : NULL;
    return q && strncmp(q, p, len) == 0 && q[len] == '/';
}

/* The path of a run of tensors with equal paths (k-th of them, k >= 2): "%~k" added. "%~"
 * cannot occur in an escaped path, so a numbered one is new; it is no directory either. */
static char *numbered(arena *mem, const char *path, size_t len, size_t k) {
    char *p = arena_text(mem, NULL, len + 23);
    if (!p) return NULL;
    memcpy(p, path, len);
    snprintf(p + len, 24, "%%~%zu", k);
    return p;
}

int treepath_assign(ckpt_catalog *cat, ckpt_err *err) {
    arena *mem = &cat->priv->text;
    size_t n = cat->ntensors;
    strbuf sb;
    sb_init(&sb);
    for (size_t i = 0; i < n; i++) {
        ckpt_tensor *t = &cat->tensors[i];
        t->path_raw = false;
        if (plain_name(t->name, t->name_len)) {
            if (!(t->path = plain_path(mem, t->prefix, t->name, t->name_len))) {
                sb_free(&sb);
                return ckpt_fail(err, -ENOMEM, "out of memory");
            }
            continue;
        }
        sb_clear(&sb);
        if (t->prefix) sb_puts(&sb, t->prefix);
        escape_name(&sb, t->name, t->name_len);
        if (sb.failed || !(t->path = arena_text(mem, sb.data, sb.len))) {
            sb_free(&sb);
            return ckpt_fail(err, -ENOMEM, "out of memory");
        }
    }
    sb_free(&sb);

    /* In path order, a repeated path is a run (numbered in name order: the tensors are sorted
     * by name, and ties by index), and the paths under a directory P follow P. */
    uint32_t *order;
    int rc = sort_by_path(cat, &order);
    if (rc) return ckpt_fail(err, rc, "%zu tensors: %s", n, strerror(-rc));
    for (size_t a = 0, b; a < n; a = b) {
        ckpt_tensor *first = &cat->tensors[order ? order[a] : a];
        const char *p = first->path;
        size_t len = strlen(p);
        for (b = a + 1; b < n && strcmp(path_at(cat, order, b), p) == 0; b++) {
        }
        bool dir = has_children(cat, order, b, n, p, len);
        for (size_t k = a + 1; k < b; k++) {
            ckpt_tensor *t = &cat->tensors[order ? order[k] : k];
            if (!(t->path = numbered(mem, p, len, k - a + 1))) {
                free(order);
                return ckpt_fail(err, -ENOMEM, "out of memory");
            }
        }
        if (dir) { /* a tensor that is also a directory: its bytes go beside it */
            char *raw = arena_text(mem, NULL, len + 4);
            if (!raw) {
                free(order);
                return ckpt_fail(err, -ENOMEM, "out of memory");
            }
            memcpy(raw, p, len);
            memcpy(raw + len, ".raw", 5);
            first->path = raw;
            first->path_raw = true;
        }
    }
    free(order);
    return 0;
}

size_t ckpt_sidecar_stem(const ckpt_tensor *t) {
    return strlen(t->path) - (t->path_raw ? 4 : 0);
}

bool ckpt_is_sidecar_path(const ckpt_tensor *t, const char *p, size_t len) {
    size_t stem = ckpt_sidecar_stem(t);
    return len == stem + 5 && memcmp(p, t->path, stem) == 0 && memcmp(p + stem, ".json", 5) == 0;
}

char *ckpt_sidecar_path(const ckpt_tensor *t) {
    size_t stem = ckpt_sidecar_stem(t);
    char *p = malloc(stem + 6);
    if (!p) return NULL;
    memcpy(p, t->path, stem);
    memcpy(p + stem, ".json", 6);
    return p;
}
