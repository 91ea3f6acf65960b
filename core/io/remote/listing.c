/* Remote listings within one set of limits: see listing.h. A repeat is found through a hash
 * map of the names kept, so a page of 80,000 links or a tree of 60,000 files in one folder
 * costs one lookup a name, not a scan of every name before it. */
#include "listing.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void remote_budget_init(remote_budget *b, const char *shown) {
    *b = (remote_budget){.shown = shown};
}

int remote_budget_page(remote_budget *b, size_t len, ckpt_err *err) {
    b->pages++;
    b->bytes += len;
    if (b->pages > REMOTE_LIST_PAGES)
        return ckpt_fail(err, -EFBIG, "%s: listing of more than %u pages refused", b->shown,
                         REMOTE_LIST_PAGES);
    if (len > REMOTE_LIST_PAGE_BYTES || b->bytes > REMOTE_LIST_BYTES)
        return ckpt_fail(err, -EFBIG, "%s: listing answers of more than %llu MiB refused", b->shown,
                         (unsigned long long)(REMOTE_LIST_BYTES >> 20));
    return 0;
}

int remote_budget_entry(remote_budget *b, size_t len, ckpt_err *err) {
    b->entries++;
    b->name_bytes += len;
    if (b->entries > REMOTE_LIST_ENTRIES || b->name_bytes > REMOTE_LIST_NAME_BYTES)
        return ckpt_fail(
            err, -EFBIG, "%s: listing of more than %u entries or %llu MiB of names refused",
            b->shown, REMOTE_LIST_ENTRIES, (unsigned long long)(REMOTE_LIST_NAME_BYTES >> 20));
    return 0;
}

void remote_listing_init(remote_listing *l, const char *shown) {
    *l = (remote_listing){0};
    remote_budget_init(&l->budget, shown);
}

int remote_listing_add(remote_listing *l, const char *name, size_t len, bool dir, uint64_t size,
                       ckpt_err *err) {
    if (!len || memchr(name, '/', len) || memchr(name, 0, len)) return 0;
    if (!l->seen_ready) {
        if (!hm_init(&l->seen, 64)) return ckpt_fail(err, -ENOMEM, "out of memory");
        l->seen_ready = true;
    }
    const hm_entry *had = hm_get(&l->seen, name, len);
    if (had) {
        if (dir && !l->e[had->value].dir)
            l->e[had->value] = (remote_entry){l->e[had->value].name, true, 0};
        return 0;
    }
    int rc = remote_budget_entry(&l->budget, len, err);
    if (rc) return rc;
    if (l->n == l->cap) {
        size_t c = l->cap ? 2 * l->cap : 64;
        remote_entry *p = realloc(l->e, c * sizeof *p);
        if (!p) return ckpt_fail(err, -ENOMEM, "out of memory");
        l->e = p;
        l->cap = c;
    }
    char *s = strndup(name, len);
    if (!s) return ckpt_fail(err, -ENOMEM, "out of memory");
    bool added;
    /* The key is the copy, which lives as long as the entry (the array may move, the names
     * do not). */
    if (!hm_put(&l->seen, s, len, l->n, &added)) {
        free(s);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    l->e[l->n++] = (remote_entry){s, dir, dir ? 0 : size};
    return 0;
}

void remote_listing_take(remote_listing *l, remote_entry **out, size_t *n) {
    *out = l->e;
    *n = l->n;
    l->e = NULL;
    l->n = l->cap = 0;
    remote_listing_free(l);
}

void remote_listing_free(remote_listing *l) {
    for (size_t i = 0; i < l->n; i++) free(l->e[i].name);
    free(l->e);
    if (l->seen_ready) hm_free(&l->seen);
    *l = (remote_listing){0};
}
