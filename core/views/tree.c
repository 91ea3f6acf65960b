#include "tree.h"
#include "../util/grow.h"

#include "../read/dequant.h"
#include "../util/hashmap.h"

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
    /* full directory path -> node index, for the directories that are not a tensor's alone:
     * those of the documents, aux and view files, all under .ckptfs/ (tensors_in adds the
     * tensor directories there, such as the per-rank copies') */
    hashmap dirs;
    const char *last_dir; /* the directory of the previous file: the next is mostly there too */
    size_t last_len;
    uint32_t last_node;
    char **owned; /* paths we had to allocate (aux files) */
    size_t nowned;
} builder;

_Static_assert(sizeof(node) == 24, "a node grew: a million-tensor mount holds two million");

static int new_node(builder *b, const char *name, size_t len, uint32_t parent, node_kind kind,
                    size_t ref, uint32_t *out) {
    tree *tr = b->tr;
    if (GROW(tr->nodes, b->cap, tr->nnodes + 1)) return -ENOMEM;
    if (len > 255) return -ENAMETOOLONG;
    if (tr->nnodes >= UINT32_MAX / 2) return -E2BIG; /* ids above the nodes name .npy files */
    node *n = &tr->nodes[tr->nnodes];
    memset(n, 0, sizeof *n);
    n->name = name;
    n->name_len = (uint32_t)len & 0xff;
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

/* The tensors sorted by path: NULL in *order when they are in order already (plain names
 * make paths in name order). */
static int tensors_by_path(const ckpt_catalog *cat, uint32_t **order);

/* Directories the tensor files go into, as a stack: the tensors come in path order, so each
 * directory's files and subdirectories come in one run and a directory, once left, is never
 * seen again. No map of every directory: at 300,000 directories it took 32 MB. */
typedef struct dir_level {
    size_t end; /* where its path ends in the stack's path */
    uint32_t node;
} dir_level;

typedef struct dir_stack {
    dir_level *level; /* level[k]: the directory of depth k + 1 */
    size_t depth, cap;
    const char *path; /* the path the directories are of (the previous tensor's) */
    size_t len;       /* the length of its directory part */
} dir_stack;

/* .ckptfs and the directories under it: where documents, aux and view files go too. */
static bool under_meta_dir(const char *path, size_t len) {
    return len >= 7 && memcmp(path, ".ckptfs", 7) == 0 && (len == 7 || path[7] == '/');
}

/* The node of the directory path[0..len) (the directory of a file at path), creating what is
 * missing below the part it shares with the previous one. */
static int stacked_dir(builder *b, dir_stack *st, const char *path, size_t len, uint32_t *out) {
    size_t same = 0, most = len < st->len ? len : st->len;
    while (same < most && path[same] == st->path[same]) same++;
    while (st->depth &&
           !(st->level[st->depth - 1].end <= same &&
             (st->level[st->depth - 1].end == len || path[st->level[st->depth - 1].end] == '/')))
        st->depth--;
    st->path = path;
    st->len = len;
    uint32_t at = st->depth ? st->level[st->depth - 1].node : 0;
    for (size_t start = st->depth ? st->level[st->depth - 1].end + 1 : 0; start < len;) {
        const char *slash = memchr(path + start, '/', len - start);
        size_t end = slash ? (size_t)(slash - path) : len;
        if (GROW(st->level, st->cap, st->depth + 1)) return -ENOMEM;
        int rc = new_node(b, path + start, end - start, at, NODE_DIR, 0, &at);
        if (rc) return rc;
        bool added;
        if (under_meta_dir(path, end) && !hm_put(&b->dirs, path, end, at, &added)) return -ENOMEM;
        st->level[st->depth++] = (dir_level){end, at};
        start = end + 1;
    }
    *out = at;
    return 0;
}

/* Sidecar names ("w.json"): the catalog keeps no sidecar paths. Equal names in a row share a
 * copy (a model's 300,000 experts all have a "w"). */
typedef struct sidecar_names {
    arena *mem;
    const char *last;
    size_t last_len;
} sidecar_names;

static const char *sidecar_name(sidecar_names *sn, const char *stem, size_t len) {
    if (sn->last && sn->last_len == len + 5 && memcmp(sn->last, stem, len) == 0) return sn->last;
    char *p = arena_text(sn->mem, NULL, len + 5);
    if (!p) return NULL;
    memcpy(p, stem, len);
    memcpy(p + len, ".json", 6);
    sn->last = p;
    sn->last_len = len + 5;
    return p;
}

/* The tensors' files: raw bytes and sidecar, in path order. */
static int tensors_in(builder *b, const ckpt_catalog *cat) {
    uint32_t *order;
    int rc = tensors_by_path(cat, &order);
    if (rc) return rc;
    dir_stack st = {0};
    sidecar_names sn = {.mem = &b->tr->names};
    for (size_t k = 0; !rc && k < cat->ntensors; k++) {
        size_t i = order ? order[k] : k;
        const ckpt_tensor *t = &cat->tensors[i];
        const char *slash = strrchr(t->path, '/');
        size_t dir_len = slash ? (size_t)(slash - t->path) : 0;
        const char *name = slash ? slash + 1 : t->path;
        size_t stem = ckpt_sidecar_stem(t) - (size_t)(name - t->path);
        uint32_t parent, id;
        rc = stacked_dir(b, &st, t->path, dir_len, &parent);
        if (!rc) rc = new_node(b, name, strlen(name), parent, NODE_TENSOR, i, &id);
        const char *side = rc ? NULL : sidecar_name(&sn, name, stem);
        if (!rc && !side) rc = -ENOMEM;
        if (!rc) rc = new_node(b, side, stem + 5, parent, NODE_SIDECAR, i, &id);
    }
    free(st.level);
    free(order);
    return rc;
}

static int by_path(const void *a, const void *b, void *ctx) {
    const ckpt_catalog *cat = ctx;
    return strcmp(cat->tensors[*(const uint32_t *)a].path, cat->tensors[*(const uint32_t *)b].path);
}

static int tensors_by_path(const ckpt_catalog *cat, uint32_t **order) {
    size_t n = cat->ntensors;
    *order = NULL;
    size_t k = 1;
    while (k < n && strcmp(cat->tensors[k - 1].path, cat->tensors[k].path) < 0) k++;
    if (k >= n) return 0;
    uint32_t *o = malloc(n * sizeof *o);
    if (!o) return -ENOMEM;
    for (size_t i = 0; i < n; i++) o[i] = (uint32_t)i;
    qsort_r(o, n, sizeof *o, by_path, (void *)cat);
    *order = o;
    return 0;
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

/* A .npy where numpy can hold the bytes read: the stored dtype's, or with -o as_dtype=f32 the
 * float32 a BF16, F8 or ggml tensor is read as (its .npy then holds those, '<f4'). */
static bool shows_npy(const ckpt_tensor *t, bool as_f32) {
    return ckpt_dtype_info_of(t->dtype)->numpy || (as_f32 && ckpt_to_f32_supported(t->dtype));
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
    arena_init(&tr->names);
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
    if (!rc && !hf_root) rc = tensors_in(&b, cat);
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
    arena_free(&tr->names);
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

bool tree_converted(const tree *tr, const ckpt_tensor *t) {
    return tr->as_f32 && ckpt_to_f32_supported(t->dtype);
}

uint64_t tree_node_size(const tree *tr, node *n) {
    const ckpt_catalog *cat = tr->cat;
    switch (n->kind) {
    case NODE_DIR:
    case NODE_DOC:
        return 0;
    case NODE_TENSOR: {
        const ckpt_tensor *t = &cat->tensors[n->ref];
        return tree_converted(tr, t) ? t->numel * 4 : t->nbytes;
    }
    case NODE_AUX:
        return cat->sources[n->ref].size;
    case NODE_VIEW:
        return tr->view->files[n->ref].vf.size;
    case NODE_SIDECAR:
    case NODE_NPY: {
        uint32_t known = atomic_load_explicit(&n->size_plus1, memory_order_relaxed);
        if (known) return known - 1;
        const ckpt_tensor *t = &cat->tensors[n->ref];
        size_t len;
        char *text =
            n->kind == NODE_NPY ? tree_npy_header(tr, t, &len) : tree_sidecar_text(tr, n, &len);
        if (!text) return 0;
        free(text);
        uint64_t data = tree_converted(tr, t) ? t->numel * 4 : t->nbytes;
        uint64_t size = n->kind == NODE_NPY ? len + data : len;
        if (size < UINT32_MAX)
            atomic_store_explicit(&n->size_plus1, (uint32_t)size + 1, memory_order_relaxed);
        return size;
    }
    }
    return 0;
}

char *tree_npy_header(const tree *tr, const ckpt_tensor *t, size_t *len) {
    if (!tree_converted(tr, t)) return ckpt_npy_header(t, len);
    ckpt_tensor f = *t;
    f.dtype = CKPT_F32;
    f.nbytes = t->numel * 4;
    return ckpt_npy_header(&f, len);
}

char *tree_sidecar_text(const tree *tr, const node *n, size_t *len) {
    const ckpt_tensor *t = &tr->cat->tensors[n->ref];
    return ckpt_sidecar_json_as(tr->cat, t, tree_converted(tr, t), len);
}

size_t tree_plan_text(const char *text, size_t text_len, uint64_t off, uint64_t len,
                      ckpt_segment *seg, size_t cap, uint64_t *done) {
    *done = 0;
    if (!text || off >= text_len || cap == 0) return 0;
    *done = len < text_len - off ? len : text_len - off;
    seg[0] = (ckpt_segment){.kind = CKPT_SEG_MEM, .mem = text + off, .length = *done};
    return 1;
}

size_t tree_plan(const tree *tr, const node *n, uint64_t off, uint64_t len, ckpt_segment *seg,
                 size_t cap, uint64_t *done) {
    const ckpt_catalog *cat = tr->cat;
    *done = 0;
    switch (n->kind) {
    case NODE_TENSOR:
        return ckpt_plan(&cat->tensors[n->ref], off, len, seg, cap, done);
    case NODE_VIEW:
        return ckpt_vfile_plan(&tr->view->files[n->ref].vf, off, len, seg, cap, done);
    case NODE_AUX: {
        uint64_t size = cat->sources[n->ref].size;
        if (off >= size || cap == 0) return 0;
        *done = len < size - off ? len : size - off;
        seg[0] =
            (ckpt_segment){.kind = CKPT_SEG_FILE, .source = n->ref, .offset = off, .length = *done};
        return 1;
    }
    case NODE_DIR:
    case NODE_SIDECAR:
    case NODE_NPY:
    case NODE_DOC:
        break;
    }
    return 0;
}

static bool pieces_current(const ckpt_catalog *cat, const ckpt_tensor *t) {
    for (uint32_t k = 0; k < t->npieces; k++)
        if (!ckpt_source_current(&cat->sources[t->pieces[k].source])) return false;
    return true;
}

bool tree_node_current(const tree *tr, const node *n, bool by_range) {
    const ckpt_catalog *cat = tr->cat;
    switch (n->kind) {
    case NODE_TENSOR:
    case NODE_NPY:
        return pieces_current(cat, &cat->tensors[n->ref]);
    case NODE_AUX:
        return ckpt_source_current(&cat->sources[n->ref]);
    case NODE_VIEW: /* the distinct sources of this file: one look at each, not one a tensor */
        for (uint32_t i = tr->view_src_first[n->ref]; i < tr->view_src_first[n->ref + 1]; i++) {
            const ckpt_source *s = &cat->sources[tr->view_srcs[i]];
            if (!(by_range ? ckpt_source_same_file(s) : ckpt_source_current(s))) return false;
        }
        return true;
    case NODE_DIR:
    case NODE_SIDECAR:
    case NODE_DOC:
        break;
    }
    return true;
}

/* Bytes a front end may compare at open to tell that a node made in part in memory is still its
 * source's: the HF view writes again the opening of a header it serves unchanged (40 bytes). */
enum { WHOLE_MEM_MAX = 4096 };

/* Walks n's plan; each segment's bytes must be those of the one source at the same offset.
 * File segments say so by their offsets; memory ones (at most WHOLE_MEM_MAX bytes in all) are
 * compared with the source's bytes when src is known (the second walk). */
static bool plan_is_source(const tree *tr, node *n, uint64_t size, uint32_t *src, bool compare) {
    const ckpt_catalog *cat = tr->cat;
    uint64_t at = 0, mem = 0;
    while (at < size) {
        enum { BATCH = 16 };
        ckpt_segment seg[BATCH];
        uint64_t done, file_off;
        size_t k = tree_plan(tr, n, at, size - at, seg, BATCH, &done);
        if (k == 0 || done == 0) return false;
        for (size_t i = 0; i < k; i++) {
            if (seg[i].kind == CKPT_SEG_MEM) {
                if ((mem += seg[i].length) > WHOLE_MEM_MAX) return false;
                /* The bytes as they are now, unchecked: whether the source changed is the
                 * caller's question (an open of a changed source fails, not passes by). */
                char buf[WHOLE_MEM_MAX];
                if (compare && (ckpt_source_pread(&cat->sources[*src], buf, seg[i].length, at) !=
                                    (ssize_t)seg[i].length ||
                                memcmp(buf, seg[i].mem, seg[i].length) != 0))
                    return false;
            } else if (seg[i].kind != CKPT_SEG_FILE ||
                       (*src != UINT32_MAX && seg[i].source != *src) ||
                       !ckpt_source_file_extent(&cat->sources[seg[i].source], seg[i].offset,
                                                seg[i].length, &file_off) ||
                       file_off != at) {
                return false;
            } else {
                *src = seg[i].source;
            }
            at += seg[i].length;
        }
    }
    return true;
}

uint32_t tree_node_whole_source(const tree *tr, node *n) {
    const ckpt_catalog *cat = tr->cat;
    if (n->kind == NODE_TENSOR && tree_converted(tr, &cat->tensors[n->ref])) return UINT32_MAX;
    uint64_t size = tree_node_size(tr, n);
    uint32_t src = UINT32_MAX;
    /* The first walk finds the source and ends at the first segment that is not it (a
     * synthesized header, another source); the second compares what lies in memory. */
    if (!plan_is_source(tr, n, size, &src, false) || src == UINT32_MAX) return UINT32_MAX;
    const ckpt_source *s = &cat->sources[src];
    if (!ckpt_source_whole_file(s) || s->size != size) return UINT32_MAX;
    return plan_is_source(tr, n, size, &src, true) ? src : UINT32_MAX;
}
