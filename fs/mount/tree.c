#include "tree.h"
#include "core/grow.h"

#include "core/dequant.h"
#include "core/hashmap.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const doc_paths[DOC_COUNT] = {
    [DOC_SUMMARY] = ".ckptfs/summary.json", [DOC_METADATA] = ".ckptfs/metadata.json",
    [DOC_TSV] = ".ckptfs/tensors.tsv",      [DOC_STATS] = ".ckptfs/stats.json",
    [DOC_CACHE] = ".ckptfs/cache.json",
};

typedef struct builder {
    tree *tr;
    size_t cap;
    hashmap dirs;         /* full directory path -> node index */
    const char *last_dir; /* the directory of the previous file: the next is mostly there too */
    size_t last_len;
    uint32_t last_node;
    char **owned; /* paths we had to allocate (aux files) */
    size_t nowned;
} builder;

static int new_node(builder *b, const char *name, size_t len, uint32_t parent, node_kind kind,
                    size_t ref, uint32_t *out) {
    tree *tr = b->tr;
    if (GROW(tr->nodes, b->cap, tr->nnodes + 1)) return -ENOMEM;
    if (len > 255) return -ENAMETOOLONG;
    if (tr->nnodes >= UINT32_MAX / 2) return -E2BIG; /* ids above the nodes name .npy files */
    node *n = &tr->nodes[tr->nnodes];
    memset(n, 0, sizeof *n);
    n->name = name;
    n->name_len = (uint32_t)len;
    n->parent = parent;
    n->kind = kind;
    n->ref = (uint32_t)ref;
    *out = (uint32_t)tr->nnodes++;
    return 0;
}

/* The directory node for path[0..len) ('/'-separated), created with its missing ancestors.
 * Looks up the deepest existing ancestor first, so a file whose directory exists costs one
 * hash lookup however deep it is (rehashing every prefix made mounts of 100k tensors slow). */
static int dir_node(builder *b, const char *path, size_t len, uint32_t *out) {
    if (b->last_dir && len == b->last_len && memcmp(path, b->last_dir, len) == 0) {
        *out = b->last_node;
        return 0;
    }
    uint32_t at = 0; /* root */
    size_t have = len;
    while (have > 0) {
        const hm_entry *e = hm_get(&b->dirs, path, have);
        if (e) {
            at = (uint32_t)e->value;
            break;
        }
        const char *slash = memrchr(path, '/', have);
        have = slash ? (size_t)(slash - path) : 0;
    }
    if (b->tr->nodes[at].kind != NODE_DIR) return -EEXIST;
    for (size_t start = have ? have + 1 : 0; start <= len && have < len; start = have + 1) {
        const char *slash = memchr(path + start, '/', len - start);
        have = slash ? (size_t)(slash - path) : len;
        uint32_t d;
        int rc = new_node(b, path + start, have - start, at, NODE_DIR, 0, &d);
        if (rc) return rc;
        bool added;
        hm_entry *e = hm_put(&b->dirs, path, have, d, &added);
        if (!e) return -ENOMEM;
        at = d;
    }
    *out = at;
    b->last_dir = path; /* paths outlive the builder */
    b->last_len = len;
    b->last_node = at;
    return 0;
}

/* Adds a file at `path` ('/'-separated, already escaped), creating its directories. */
static int add_path(builder *b, const char *path, node_kind kind, size_t ref) {
    const char *slash = strrchr(path, '/');
    size_t dir_len = slash ? (size_t)(slash - path) : 0;
    const char *name = slash ? slash + 1 : path;
    uint32_t parent;
    int rc = dir_node(b, path, dir_len, &parent);
    if (rc) return rc;
    return new_node(b, name, strlen(name), parent, kind, ref, &parent);
}

static int name_cmp(const void *a, const void *b, void *ctx) {
    const tree *tr = ctx;
    const node *x = &tr->nodes[*(const uint32_t *)a];
    const node *y = &tr->nodes[*(const uint32_t *)b];
    size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
    int c = memcmp(x->name, y->name, n);
    if (c) return c;
    return (x->name_len > y->name_len) - (x->name_len < y->name_len);
}

/* Children grouped by parent with a counting sort, then each directory sorted by name: most
 * directories hold a handful of entries that arrive already in order. */
static int link_children(tree *tr, ckpt_err *err) {
    size_t n = tr->nnodes - 1;
    tr->children = malloc((n ? n : 1) * sizeof *tr->children);
    if (!tr->children) return ckpt_fail(err, -ENOMEM, "out of memory");
    for (size_t i = 1; i < tr->nnodes; i++) tr->nodes[tr->nodes[i].parent].nchildren++;
    uint32_t next = 0;
    for (size_t i = 0; i < tr->nnodes; i++) {
        if (tr->nodes[i].kind != NODE_DIR) continue;
        tr->nodes[i].first_child = next;
        next += tr->nodes[i].nchildren;
        tr->nodes[i].nchildren = 0;
    }
    for (size_t i = 1; i < tr->nnodes; i++) {
        node *p = &tr->nodes[tr->nodes[i].parent];
        tr->children[p->first_child + p->nchildren++] = (uint32_t)i;
    }
    for (size_t i = 0; i < tr->nnodes; i++) {
        const node *d = &tr->nodes[i];
        if (d->kind != NODE_DIR) continue;
        uint32_t *c = tr->children + d->first_child;
        bool sorted = true;
        for (uint32_t k = 1; sorted && k < d->nchildren; k++)
            sorted = name_cmp(&c[k - 1], &c[k], tr) < 0;
        if (!sorted) qsort_r(c, d->nchildren, sizeof *c, name_cmp, tr);
        for (uint32_t k = 1; k < d->nchildren; k++)
            if (name_cmp(&c[k - 1], &c[k], tr) == 0) {
                const node *x = &tr->nodes[c[k]];
                return ckpt_fail(err, -EEXIST, "two entries named \"%.*s\" in one directory",
                                 (int)x->name_len, x->name);
            }
    }
    return 0;
}

/* .npy files carry stored bytes, so tensors converted on read get none. */
static bool shows_npy(const ckpt_tensor *t, bool as_f32) {
    return ckpt_dtype_info_of(t->dtype)->numpy && !(as_f32 && ckpt_to_f32_supported(t->dtype));
}

/* Adds dir + name, a path the builder allocates and keeps (b->owned has room for it). */
static int add_owned_path(builder *b, const char *dir, const char *name, node_kind kind,
                          size_t ref) {
    size_t len = strlen(dir) + strlen(name);
    char *p = malloc(len + 1);
    if (!p) return -ENOMEM;
    snprintf(p, len + 1, "%s%s", dir, name);
    b->owned[b->nowned++] = p;
    return add_path(b, p, kind, ref);
}

/* Adds the view's files (after the aux files, which share its directory). */
static int add_view(builder *b, const ckpt_hfview *view, const char *hf_dir) {
    if (view->nfiles >= UINT32_MAX) return -E2BIG;
    char **owned = realloc(b->owned, (b->nowned + view->nfiles + 1) * sizeof *owned);
    if (!owned) return -ENOMEM;
    b->owned = owned;
    int rc = 0;
    for (size_t i = 0; !rc && i < view->nfiles; i++)
        rc = add_owned_path(b, hf_dir, view->files[i].name, NODE_VIEW, i);
    return rc;
}

/* Gathers the distinct sources of one view file's tensors. */
typedef struct source_set {
    tree *tr;
    uint32_t *stamp; /* per source: 1 + the last file that listed it */
    uint32_t file;
    size_t n, cap;
    int rc;
} source_set;

static void add_sources(void *ctx, const ckpt_tensor *t) {
    source_set *set = ctx;
    for (uint32_t k = 0; !set->rc && k < t->npieces; k++) {
        uint32_t s = t->pieces[k].source;
        if (set->stamp[s] == set->file + 1) continue;
        set->stamp[s] = set->file + 1;
        if (set->n == set->cap) {
            uint32_t *more = realloc(set->tr->view_srcs, 2 * set->cap * sizeof *more);
            if (!more) {
                set->rc = -ENOMEM;
                return;
            }
            set->tr->view_srcs = more;
            set->cap *= 2;
        }
        set->tr->view_srcs[set->n++] = s;
    }
}

/* For each view file, the distinct sources its tensors read from. */
static int index_view_sources(tree *tr) {
    const ckpt_hfview *view = tr->view;
    const ckpt_catalog *cat = tr->cat;
    source_set set = {.tr = tr, .cap = 16};
    set.stamp = calloc(cat->nsources ? cat->nsources : 1, sizeof *set.stamp);
    tr->view_src_first = calloc(view->nfiles + 1, sizeof *tr->view_src_first);
    tr->view_srcs = malloc(set.cap * sizeof *tr->view_srcs);
    set.rc = set.stamp && tr->view_src_first && tr->view_srcs ? 0 : -ENOMEM;
    for (size_t f = 0; !set.rc && f < view->nfiles; f++) {
        tr->view_src_first[f] = (uint32_t)set.n;
        set.file = (uint32_t)f;
        ckpt_hfview_each_tensor(&view->files[f], add_sources, &set);
    }
    if (!set.rc) tr->view_src_first[view->nfiles] = (uint32_t)set.n;
    free(set.stamp);
    return set.rc;
}

mode_t tree_source_mode(const tree *tr, const node *n) {
    const ckpt_catalog *cat = tr->cat;
    mode_t m = 07777;
    switch (n->kind) {
    case NODE_AUX:
        return cat->sources[n->ref].mode & 07777;
    case NODE_TENSOR:
    case NODE_SIDECAR:
    case NODE_NPY: {
        const ckpt_tensor *t = &cat->tensors[n->ref];
        if (!t->npieces) return tr->all_sources_mode;
        for (uint32_t k = 0; k < t->npieces; k++) m &= cat->sources[t->pieces[k].source].mode;
        return m;
    }
    case NODE_VIEW: {
        uint32_t a = tr->view_src_first[n->ref], b = tr->view_src_first[n->ref + 1];
        if (a == b) return tr->all_sources_mode; /* the index: names of every tensor */
        for (uint32_t i = a; i < b; i++) m &= cat->sources[tr->view_srcs[i]].mode;
        return m;
    }
    case NODE_DIR:
    case NODE_DOC:
        break;
    }
    return tr->all_sources_mode;
}

int tree_build(tree *tr, const ckpt_catalog *cat, tree_view_fn get_view, void *view_ctx,
               bool hf_root, bool npy, bool as_f32, ckpt_err *err) {
    memset(tr, 0, sizeof *tr);
    tr->cat = cat;
    builder b = {.tr = tr};
    const ckpt_hfview *view;
    tr->npy = npy && !hf_root;
    tr->as_f32 = as_f32;
    if (cat->ntensors >= UINT32_MAX || cat->nsources >= UINT32_MAX) {
        get_view(view_ctx, &view, err); /* lets a thread building it finish */
        return ckpt_fail(err, -E2BIG, "%zu tensors: more than a tree can index", cat->ntensors);
    }
    /* The map starts small and grows with the directories: sized for one a tensor, it was
     * 64 MiB at a million tensors in one directory, cleared (so resident) for nothing. */
    if (!hm_init(&b.dirs, 4096)) {
        get_view(view_ctx, &view, err);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    b.owned = calloc(cat->naux + 1, sizeof *b.owned);
    const char *hf_dir = hf_root ? "" : ".ckptfs/hf/";
    /* Sized up front (two files and about one directory a tensor, room for a view of a few
     * hundred shards): doubling would copy and, at its peak, hold 1.5x the table; pages
     * never touched cost no memory. */
    b.cap = 4 * cat->ntensors + cat->naux + DOC_COUNT + 512;
    tr->nodes = malloc(b.cap * sizeof *tr->nodes);
    uint32_t root;
    int rc = b.owned && tr->nodes ? new_node(&b, "", 0, 0, NODE_DIR, 0, &root) : -ENOMEM;
    for (size_t i = 0; !rc && !hf_root && i < cat->ntensors; i++) {
        rc = add_path(&b, cat->tensors[i].path, NODE_TENSOR, i);
        if (!rc) rc = add_path(&b, cat->tensors[i].sidecar_path, NODE_SIDECAR, i);
    }
    bool remote = false;
    for (uint32_t s = 0; s < cat->nsources && !remote; s++) remote = cat->sources[s].remote;
    for (int d = 0; !rc && d < DOC_COUNT; d++)
        if (d != DOC_CACHE || remote) rc = add_path(&b, doc_paths[d], NODE_DOC, (size_t)d);
    for (size_t i = 0; !rc && i < cat->naux; i++)
        rc = add_owned_path(&b, hf_dir, cat->aux[i].name, NODE_AUX, cat->aux[i].source);
    ckpt_err view_err;
    int view_rc = get_view(view_ctx, &view, &view_err);
    if (!rc && !view_rc) rc = add_view(&b, view, hf_dir);
    tr->view = view_rc ? NULL : view;
    hm_free(&b.dirs);
    if (rc || view_rc) {
        for (size_t i = 0; i < b.nowned; i++) free(b.owned[i]);
        free(b.owned);
        tree_free(tr);
        if (rc) return ckpt_fail(err, rc, "building the tree: %s", strerror(-rc));
        *err = view_err;
        return view_rc;
    }
    /* Aux names must outlive the builder: keep them in the tree's lifetime via the nodes. */
    tr->owned = b.owned;
    tr->nowned = b.nowned;
    /* Config and tokenizer files are shown as they are, with their own mode: only the files
     * tensors and headers come from decide who may list the tree. */
    tr->all_sources_mode = 07777;
    for (uint32_t i = 0; i < cat->nsources; i++) {
        bool aux = false;
        for (size_t k = 0; !aux && k < cat->naux; k++) aux = cat->aux[k].source == i;
        if (!aux) tr->all_sources_mode &= cat->sources[i].mode;
        const struct timespec *m = &cat->sources[i].mtime;
        if (m->tv_sec > tr->mtime.tv_sec ||
            (m->tv_sec == tr->mtime.tv_sec && m->tv_nsec > tr->mtime.tv_nsec))
            tr->mtime = *m;
    }
    node *fit = realloc(tr->nodes, tr->nnodes * sizeof *tr->nodes);
    if (fit) tr->nodes = fit;
    if (tr->view && (rc = index_view_sources(tr))) {
        tree_free(tr);
        return ckpt_fail(err, rc, "building the tree: %s", strerror(-rc));
    }
    if ((rc = link_children(tr, err))) {
        tree_free(tr);
        return rc;
    }
    for (uint32_t k = 0; tr->npy && k < tr->nnodes; k++) tr->nnpy += tree_has_npy(tr, k);
    return 0;
}

bool tree_has_npy(const tree *tr, uint32_t k) {
    return tr->npy && tr->nodes[k].kind == NODE_SIDECAR &&
           shows_npy(&tr->cat->tensors[tr->nodes[k].ref], tr->as_f32);
}

node *tree_node(const tree *tr, uint32_t id, node_buf *buf) {
    if (id < tr->nnodes) return &tr->nodes[id];
    uint32_t k = id - (uint32_t)tr->nnodes;
    if (id - tr->nnodes >= tr->nnodes || !tree_has_npy(tr, k)) return NULL;
    const node *side = &tr->nodes[k];
    size_t stem = side->name_len - 5; /* NAME.json: at most 255 bytes */
    memcpy(buf->name, side->name, stem);
    memcpy(buf->name + stem, ".npy", 4);
    buf->n = (node){.name = buf->name,
                    .name_len = (uint32_t)stem + 4,
                    .parent = side->parent,
                    .ref = side->ref,
                    .kind = NODE_NPY};
    return &buf->n;
}

void tree_free(tree *tr) {
    for (size_t i = 0; i < tr->nowned; i++) free(tr->owned[i]);
    free(tr->owned);
    free(tr->nodes);
    free(tr->children);
    free(tr->view_src_first);
    free(tr->view_srcs);
    memset(tr, 0, sizeof *tr);
}

static uint32_t lookup_stored(const tree *tr, uint32_t parent, const char *name, size_t len);

uint32_t tree_lookup(const tree *tr, uint32_t parent, const char *name, size_t len) {
    if (parent >= tr->nnodes) return UINT32_MAX;
    uint32_t found = lookup_stored(tr, parent, name, len);
    if (found != UINT32_MAX || !tr->npy || len < 5 || len > 254 ||
        memcmp(name + len - 4, ".npy", 4) != 0)
        return found;
    /* NAME.npy: the node beside the sidecar NAME.json */
    char side[256];
    memcpy(side, name, len - 4);
    memcpy(side + len - 4, ".json", 5);
    uint32_t k = lookup_stored(tr, parent, side, len + 1);
    return k != UINT32_MAX && tree_has_npy(tr, k) ? (uint32_t)tr->nnodes + k : UINT32_MAX;
}

static uint32_t lookup_stored(const tree *tr, uint32_t parent, const char *name, size_t len) {
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
