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
#include "text.h"

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
    if (n == 0)
        sb_puts(sb, "%_");
    else
        pct_escape(sb, p, n, false);
}

/* Returns true when the component was shortened (two names may then share a path). */
static bool escape_component(strbuf *sb, const char *p, size_t n) {
    size_t start = sb->len;
    treepath_escape_component(sb, p, n);
    if (sb->failed || sb->len - start <= LONG_NAME) return false;
    {
        sb->len = start + LONG_KEEP;
        /* Do not cut an escape in half. */
        for (size_t k = 1; k <= 2; k++)
            if (sb->data[sb->len - k] == '%') sb->len -= k;
        sb_printf(sb, "%%#%016llx", (unsigned long long)treepath_hash(p, n));
    }
    return true;
}

/* Returns true when the path may equal another name's: the name holds a '/' (a.b and a/b
 * meet) or a component was shortened. Otherwise escaping is one-to-one. */
static bool escape_name(strbuf *sb, const char *name, size_t len) {
    bool may_repeat = false;
    size_t s = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i == len || name[i] == '.' || name[i] == '/') {
            if (s) sb_putc(sb, '/');
            may_repeat |= escape_component(sb, name + s, i - s);
            may_repeat |= i < len && name[i] == '/';
            s = i + 1;
        }
    }
    return may_repeat;
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

int treepath_assign(ckpt_catalog *cat, ckpt_err *err) {
    arena *mem = &cat->priv->text;
    size_t n = cat->ntensors;
    strbuf sb;
    sb_init(&sb);
    bool may_repeat = false;
    for (size_t i = 0; i < n; i++) {
        ckpt_tensor *t = &cat->tensors[i];
        if (plain_name(t->name, t->name_len)) {
            may_repeat |= t->prefix != NULL;
            if (!(t->path = plain_path(mem, t->prefix, t->name, t->name_len))) {
                sb_free(&sb);
                return ckpt_fail(err, -ENOMEM, "out of memory");
            }
            continue;
        }
        sb_clear(&sb);
        if (t->prefix) sb_puts(&sb, t->prefix);
        may_repeat |= escape_name(&sb, t->name, t->name_len) || t->prefix;
        if (sb.failed || !(t->path = arena_text(mem, sb.data, sb.len))) {
            sb_free(&sb);
            return ckpt_fail(err, -ENOMEM, "out of memory");
        }
    }
    sb_free(&sb);
    if (n == 0) return 0;

    /* Repeated paths are numbered in name order (the tensors are sorted by name): a hash of
     * path -> times seen. "%~" cannot occur in an escaped path, so a numbered one is new.
     * Names are unique, so without a prefix, a '/' or a shortened component nothing repeats. */
    hashmap seen;
    if (!hm_init(&seen, may_repeat ? n : 0)) return ckpt_fail(err, -ENOMEM, "out of memory");
    for (size_t i = 0; may_repeat && i < n; i++) {
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
        char *p = arena_text(mem, NULL, len + 23);
        if (!p) {
            hm_free(&seen);
            return ckpt_fail(err, -ENOMEM, "out of memory");
        }
        memcpy(p, t->path, len);
        snprintf(p + len, 24, "%%~%zu", run);
        t->path = p;
    }
    hm_free(&seen);

    /* Directories: every proper prefix ending before a '/'. A model has far fewer directories
     * than tensors (one per layer and module), so the map starts small and grows: sizing it
     * for every '/' of every path made a 32 MiB table at 100k tensors. */
    hashmap dirs;
    if (!hm_init(&dirs, n / 4)) return ckpt_fail(err, -ENOMEM, "out of memory");
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
        char *side = arena_text(mem, NULL, len + 5);
        if (!side) {
            hm_free(&dirs);
            return ckpt_fail(err, -ENOMEM, "out of memory");
        }
        memcpy(side, t->path, len);
        memcpy(side + len, ".json", 6);
        t->sidecar_path = side;
        if (hm_get(&dirs, t->path, len)) {
            char *raw = arena_text(mem, NULL, len + 4);
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
