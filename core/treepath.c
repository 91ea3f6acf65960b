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

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hashmap.h"
#include "strbuf.h"

/* A component is shortened past LONG_NAME bytes, so that with what may follow it — "%~N" for a
 * repeated path (up to 22 bytes) and ".json" — a file name stays within NAME_MAX (255). */
enum { LONG_NAME = 224, LONG_KEEP = 200 };

uint64_t treepath_hash(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a 64 */
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ull;
    }
    return h;
}

void treepath_escape_component(strbuf *sb, const char *p, size_t n) {
    static const char hex[] = "0123456789ABCDEF";
    if (n == 0) {
        sb_puts(sb, "%_");
        return;
    }
    for (size_t i = 0, run = 0; i <= n; i++) {
        unsigned char c = i < n ? (unsigned char)p[i] : 0;
        if (i < n && !(c < 0x20 || c == 0x7f || c == '%')) continue;
        sb_put(sb, p + run, i - run);
        run = i + 1;
        if (i < n) {
            char e[3] = {'%', hex[c >> 4], hex[c & 15]};
            sb_put(sb, e, 3);
        }
    }
}

static void escape_component(strbuf *sb, const char *p, size_t n) {
    size_t start = sb->len;
    treepath_escape_component(sb, p, n);
    if (!sb->failed && sb->len - start > LONG_NAME) {
        sb->len = start + LONG_KEEP;
        /* Do not cut an escape in half. */
        for (size_t k = 1; k <= 2; k++)
            if (sb->data[sb->len - k] == '%') sb->len -= k;
        sb_printf(sb, "%%#%016llx", (unsigned long long)treepath_hash(p, n));
    }
}

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

int treepath_assign(ckpt_catalog *cat, ckpt_err *err) {
    arena *mem = &cat->priv->mem;
    size_t n = cat->ntensors;
    strbuf sb;
    sb_init(&sb);
    for (size_t i = 0; i < n; i++) {
        ckpt_tensor *t = &cat->tensors[i];
        sb_clear(&sb);
        if (t->prefix) sb_puts(&sb, t->prefix);
        escape_name(&sb, t->name, t->name_len);
        if (sb.failed || !(t->path = arena_memdup(mem, sb.data, sb.len))) {
            sb_free(&sb);
            return ckpt_fail(err, -ENOMEM, "out of memory");
        }
    }
    sb_free(&sb);
    if (n == 0) return 0;

    /* Repeated paths are numbered in name order (the tensors are sorted by name): a hash of
     * path -> times seen. "%~" cannot occur in an escaped path, so a numbered one is new. */
    hashmap seen;
    if (!hm_init(&seen, n)) return ckpt_fail(err, -ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        ckpt_tensor *t = &cat->tensors[i];
        size_t len = strlen(t->path);
        bool added;
        hm_entry *e = hm_put(&seen, t->path, len, 1, &added);
        if (!e) {
            hm_free(&seen);
            return ckpt_fail(err, -ENOMEM, "out of memory");
        }
        if (added) continue;
        size_t run = ++e->value;
        char *p = arena_alloc(mem, len + 24);
        if (!p) {
            hm_free(&seen);
            return ckpt_fail(err, -ENOMEM, "out of memory");
        }
        memcpy(p, t->path, len);
        snprintf(p + len, 24, "%%~%zu", run);
        t->path = p;
    }
    hm_free(&seen);

    /* Directories: every proper prefix ending before a '/'. */
    size_t prefixes = 0;
    for (size_t i = 0; i < n; i++)
        for (const char *c = cat->tensors[i].path; *c; c++) prefixes += *c == '/';
    hashmap dirs;
    if (!hm_init(&dirs, prefixes)) return ckpt_fail(err, -ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        /* Deepest first: once a prefix is already known, so are all of its ancestors. */
        const char *p = cat->tensors[i].path;
        const char *slash = strrchr(p, '/');
        for (bool added = true; slash && added; slash = memrchr(p, '/', (size_t)(slash - p))) {
            if (!hm_put(&dirs, p, (size_t)(slash - p), 0, &added)) {
                hm_free(&dirs);
                return ckpt_fail(err, -ENOMEM, "out of memory");
            }
        }
    }
    for (size_t i = 0; i < n; i++) {
        ckpt_tensor *t = &cat->tensors[i];
        size_t len = strlen(t->path);
        t->sidecar_path = NULL;
        char *side = arena_alloc(mem, len + 6);
        if (!side) {
            hm_free(&dirs);
            return ckpt_fail(err, -ENOMEM, "out of memory");
        }
        memcpy(side, t->path, len);
        memcpy(side + len, ".json", 6);
        t->sidecar_path = side;
        if (hm_get(&dirs, t->path, len)) {
            char *raw = arena_alloc(mem, len + 5);
            if (!raw) {
                hm_free(&dirs);
                return ckpt_fail(err, -ENOMEM, "out of memory");
            }
            memcpy(raw, t->path, len);
            memcpy(raw + len, ".raw", 5);
            t->path = raw;
        }
    }
    hm_free(&dirs);
    return 0;
}
