#include "tree.h"

#include "../core/dequant.h"
#include "../core/hashmap.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const doc_paths[DOC_COUNT] = {
    [DOC_SUMMARY] = ".ckptfs/summary.json",
    [DOC_METADATA] = ".ckptfs/metadata.json",
    [DOC_TSV] = ".ckptfs/tensors.tsv",
};

typedef struct builder {
    tree *tr;
    size_t cap;
    hashmap dirs; /* full directory path -> node index */
    char **owned; /* paths we had to allocate (aux files) */
    size_t nowned;
} builder;

static int new_node(builder *b, const char *name, size_t len, uint32_t parent, node_kind kind,
                    size_t ref, uint32_t *out) {
    tree *tr = b->tr;
    if (tr->nnodes == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        node *n = realloc(tr->nodes, cap * sizeof *n);
        if (!n) return -ENOMEM;
        tr->nodes = n;
        b->cap = cap;
    }
    if (tr->nnodes >= UINT32_MAX - 1 || len > 255) return -ENAMETOOLONG;
    node *n = &tr->nodes[tr->nnodes];
    memset(n, 0, sizeof *n);
    n->name = name;
    n->name_len = (uint32_t)len;
    n->parent = parent;
    n->kind = kind;
    n->ref = ref;
    *out = (uint32_t)tr->nnodes++;
    return 0;
}

/* Adds a file at `path` ('/'-separated, already escaped), creating its directories. */
static int add_path(builder *b, const char *path, node_kind kind, size_t ref) {
    uint32_t parent = 0;
    const char *s = path;
    for (const char *c = path;; c++) {
        if (*c != '/' && *c != '\0') continue;
        size_t len = (size_t)(c - s);
        if (*c == '\0') return new_node(b, s, len, parent, kind, ref, &parent);
        bool added;
        hm_entry *e = hm_put(&b->dirs, path, (size_t)(c - path), 0, &added);
        if (!e) return -ENOMEM;
        if (added) {
            uint32_t d;
            int rc = new_node(b, s, len, parent, NODE_DIR, 0, &d);
            if (rc) return rc;
            e->value = d;
        }
        parent = (uint32_t)e->value;
        if (b->tr->nodes[parent].kind != NODE_DIR) return -EEXIST;
        s = c + 1;
    }
}

static const tree *sort_tree;
static int child_cmp(const void *a, const void *b) {
    const node *x = &sort_tree->nodes[*(const uint32_t *)a];
    const node *y = &sort_tree->nodes[*(const uint32_t *)b];
    if (x->parent != y->parent) return (x->parent > y->parent) - (x->parent < y->parent);
    size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
    int c = memcmp(x->name, y->name, n);
    if (c) return c;
    return (x->name_len > y->name_len) - (x->name_len < y->name_len);
}

static int link_children(tree *tr, ckpt_err *err) {
    size_t n = tr->nnodes - 1;
    tr->children = malloc((n ? n : 1) * sizeof *tr->children);
    if (!tr->children) return ckpt_fail(err, -ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) tr->children[i] = (uint32_t)(i + 1);
    sort_tree = tr;
    qsort(tr->children, n, sizeof *tr->children, child_cmp);
    for (size_t i = 0; i < n; i++) {
        node *c = &tr->nodes[tr->children[i]];
        node *p = &tr->nodes[c->parent];
        if (p->nchildren == 0)
            p->first_child = (uint32_t)i;
        else if (child_cmp(&tr->children[i - 1], &tr->children[i]) == 0)
            return ckpt_fail(err, -EEXIST, "two entries named \"%.*s\" in one directory",
                             (int)c->name_len, c->name);
        p->nchildren++;
    }
    return 0;
}

/* .npy files carry stored bytes, so tensors converted on read get none. */
static bool shows_npy(const ckpt_tensor *t, bool as_f32) {
    return ckpt_dtype_info_of(t->dtype)->numpy && !(as_f32 && ckpt_to_f32_supported(t->dtype));
}

int tree_build(tree *tr, const ckpt_catalog *cat, const ckpt_hfview *view, bool hf_root, bool npy,
               bool as_f32, ckpt_err *err) {
    memset(tr, 0, sizeof *tr);
    tr->cat = cat;
    tr->view = view;
    builder b = {.tr = tr};
    size_t expect = 2 * cat->ntensors + cat->naux + DOC_COUNT + 8;
    if (!hm_init(&b.dirs, expect)) return ckpt_fail(err, -ENOMEM, "out of memory");
    size_t nview = view ? view->nfiles : 0;
    size_t nnpy = 0;
    for (size_t i = 0; npy && !hf_root && i < cat->ntensors; i++)
        nnpy += shows_npy(&cat->tensors[i], as_f32);
    b.owned = calloc(cat->naux + nview + nnpy + 1, sizeof *b.owned);
    const char *hf_dir = hf_root ? "" : ".ckptfs/hf/";
    uint32_t root;
    int rc = b.owned ? new_node(&b, "", 0, 0, NODE_DIR, 0, &root) : -ENOMEM;
    for (size_t i = 0; !rc && !hf_root && i < cat->ntensors; i++) {
        rc = add_path(&b, cat->tensors[i].path, NODE_TENSOR, i);
        if (!rc) rc = add_path(&b, cat->tensors[i].sidecar_path, NODE_SIDECAR, i);
        if (!rc && npy && shows_npy(&cat->tensors[i], as_f32)) {
            /* x.json -> x.npy: like sidecars, never clashes with a tensor component. */
            const char *side = cat->tensors[i].sidecar_path;
            size_t len = strlen(side) - 5;
            char *p = malloc(len + 5);
            if (!p) {
                rc = -ENOMEM;
                break;
            }
            memcpy(p, side, len);
            memcpy(p + len, ".npy", 5);
            b.owned[b.nowned++] = p;
            rc = add_path(&b, p, NODE_NPY, i);
        }
    }
    for (int d = 0; !rc && d < DOC_COUNT; d++) rc = add_path(&b, doc_paths[d], NODE_DOC, (size_t)d);
    for (size_t i = 0; !rc && i < cat->naux + nview; i++) {
        bool aux = i < cat->naux;
        const char *name = aux ? cat->aux[i].name : view->files[i - cat->naux].name;
        size_t len = strlen(hf_dir) + strlen(name);
        char *p = malloc(len + 1);
        if (!p) {
            rc = -ENOMEM;
            break;
        }
        snprintf(p, len + 1, "%s%s", hf_dir, name);
        b.owned[b.nowned++] = p;
        rc = add_path(&b, p, aux ? NODE_AUX : NODE_VIEW, aux ? cat->aux[i].source : i - cat->naux);
    }
    hm_free(&b.dirs);
    if (rc) {
        for (size_t i = 0; i < b.nowned; i++) free(b.owned[i]);
        free(b.owned);
        tree_free(tr);
        return ckpt_fail(err, rc, "building the tree: %s", strerror(-rc));
    }
    /* Aux names must outlive the builder: keep them in the tree's lifetime via the nodes. */
    tr->owned = b.owned;
    tr->nowned = b.nowned;
    for (uint32_t i = 0; i < cat->nsources; i++) {
        const struct timespec *m = &cat->sources[i].mtime;
        if (m->tv_sec > tr->mtime.tv_sec ||
            (m->tv_sec == tr->mtime.tv_sec && m->tv_nsec > tr->mtime.tv_nsec))
            tr->mtime = *m;
    }
    if ((rc = link_children(tr, err))) {
        tree_free(tr);
        return rc;
    }
    return 0;
}

void tree_free(tree *tr) {
    for (size_t i = 0; i < tr->nowned; i++) free(tr->owned[i]);
    free(tr->owned);
    free(tr->nodes);
    free(tr->children);
    memset(tr, 0, sizeof *tr);
}

uint32_t tree_lookup(const tree *tr, uint32_t parent, const char *name, size_t len) {
    const node *p = &tr->nodes[parent];
    if (p->kind != NODE_DIR) return UINT32_MAX;
    size_t lo = p->first_child, hi = (size_t)p->first_child + p->nchildren;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const node *c = &tr->nodes[tr->children[mid]];
        size_t n = c->name_len < len ? c->name_len : len;
        int cmp = memcmp(c->name, name, n);
        if (!cmp) cmp = (c->name_len > len) - (c->name_len < len);
        if (cmp == 0) return tr->children[mid];
        if (cmp < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return UINT32_MAX;
}
