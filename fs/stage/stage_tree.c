/* The staged tree in memory. Directories keep their children in a chained hash table that
 * grows with them, so a flat directory of many tensors stays fast to fill and to look up. */
#include "stage_fs.h"

#include "core/util/hashmap.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

snode *snode_new(sn_kind kind, const char *name, size_t len, mode_t mode) {
    snode *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->name = malloc(len + 1);
    if (!n->name) {
        free(n);
        return NULL;
    }
    memcpy(n->name, name, len);
    n->name[len] = '\0';
    n->name_len = len;
    n->kind = kind;
    n->mode = mode & 07777;
    n->fd = -1;
    clock_gettime(CLOCK_REALTIME, &n->mtime);
    return n;
}

void snode_free(snode *n) {
    if (!n) return;
    if (n->removed_prev) { /* off the stage's list of removed nodes */
        *n->removed_prev = n->removed_next;
        if (n->removed_next) n->removed_next->removed_prev = n->removed_prev;
    }
    free(n->buckets);
    free(n->name);
    free(n);
}

void snode_free_tree(snode *n) {
    if (!n) return;
    for (size_t b = 0; b < n->nbuckets; b++) {
        snode *c = n->buckets[b];
        while (c) {
            snode *next = c->hash_next;
            snode_free_tree(c);
            c = next;
        }
    }
    snode_free(n);
}

static size_t bucket_of(const snode *dir, const char *name, size_t len) {
    return (size_t)hm_hash(name, len) & (dir->nbuckets - 1);
}

snode *tree_child(const snode *dir, const char *name, size_t len) {
    if (dir->kind != SN_DIR || !dir->nbuckets) return NULL;
    for (snode *c = dir->buckets[bucket_of(dir, name, len)]; c; c = c->hash_next)
        if (c->name_len == len && memcmp(c->name, name, len) == 0) return c;
    return NULL;
}

static int grow(snode *dir) {
    size_t nb = dir->nbuckets ? dir->nbuckets * 2 : 8;
    snode **fresh = calloc(nb, sizeof *fresh);
    if (!fresh) return -1;
    snode **old = dir->buckets;
    size_t old_n = dir->nbuckets;
    dir->buckets = fresh;
    dir->nbuckets = nb;
    for (size_t b = 0; b < old_n; b++) {
        snode *c = old[b];
        while (c) {
            snode *next = c->hash_next;
            size_t k = bucket_of(dir, c->name, c->name_len);
            c->hash_next = fresh[k];
            fresh[k] = c;
            c = next;
        }
    }
    free(old);
    return 0;
}

int tree_attach(snode *dir, snode *child) {
    if (dir->nchildren + 1 > dir->nbuckets && grow(dir) != 0) return -1;
    size_t k = bucket_of(dir, child->name, child->name_len);
    child->hash_next = dir->buckets[k];
    dir->buckets[k] = child;
    child->parent = dir;
    dir->nchildren++;
    return 0;
}

void tree_detach(snode *child) {
    snode *dir = child->parent;
    if (!dir) return;
    snode **p = &dir->buckets[bucket_of(dir, child->name, child->name_len)];
    while (*p && *p != child) p = &(*p)->hash_next;
    if (*p) {
        *p = child->hash_next;
        dir->nchildren--;
    }
    child->hash_next = NULL;
    child->parent = NULL;
}

snode *tree_ensure_dir(snode *parent, const char *name, size_t len) {
    snode *c = tree_child(parent, name, len);
    if (c) return c->kind == SN_DIR ? c : NULL;
    c = snode_new(SN_DIR, name, len, 0755);
    if (!c || tree_attach(parent, c) != 0) {
        snode_free(c);
        return NULL;
    }
    return c;
}

int tree_rename(snode *n, snode *new_parent, const char *name, size_t len) {
    char *copy = malloc(len + 1);
    if (!copy) return -1;
    memcpy(copy, name, len);
    copy[len] = '\0';
    tree_detach(n);
    free(n->name);
    n->name = copy;
    n->name_len = len;
    return tree_attach(new_parent, n);
}

static void put_path(const snode *n, strbuf *sb) {
    if (!n->parent) return; /* the root */
    put_path(n->parent, sb);
    if (n->parent->parent) sb_putc(sb, '/');
    sb_put(sb, n->name, n->name_len);
}

void tree_path(const snode *n, strbuf *sb) {
    sb_clear(sb);
    put_path(n, sb);
    if (!sb->data && sb_reserve(sb, 1)) sb->data[0] = '\0'; /* the root: "" */
}

snode *tree_resolve(snode *root, const char *path, size_t len) {
    snode *n = root;
    size_t start = 0;
    while (n && start < len) {
        size_t end = start;
        while (end < len && path[end] != '/') end++;
        n = tree_child(n, path + start, end - start);
        start = end + 1;
    }
    return n;
}

bool tree_is_ancestor(const snode *ancestor, const snode *n) {
    for (; n; n = n->parent)
        if (n == ancestor) return true;
    return false;
}

void tree_release_if_unused(snode *n) {
    if (n->removed && n->nlookup == 0 && n->nopen == 0 && !n->parent && n->nchildren == 0)
        snode_free(n);
}
