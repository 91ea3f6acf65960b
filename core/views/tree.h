/* The files a catalog shows, the same for the FUSE mount and serve: an immutable table of nodes
 * built once from a catalog, and what each node holds (tree_node_size, tree_plan,
 * tree_node_current). The mount's inode number = node index + 1, so the root (index 0) is
 * FUSE_ROOT_ID. */
#ifndef CKPT_TREE_H
#define CKPT_TREE_H

#include "../util/arena.h"
#include "../ckpt.h"
#include "hfview.h"

#include <stdatomic.h>

typedef enum {
    NODE_DIR,
    NODE_TENSOR,  /* raw bytes of tensors[ref] */
    NODE_SIDECAR, /* JSON about tensors[ref] */
    NODE_DOC,     /* generated document number ref (enum tree_doc) */
    NODE_AUX,     /* a source file shown as-is: sources[ref] */
    NODE_VIEW,    /* a synthesized file of the HF view: view->files[ref] */
    NODE_NPY,     /* tensors[ref] as a .npy file: NPY header + its bytes */
} node_kind;

/* DOC_STATS reads every tensor: it is computed on first read, never to size it. DOC_CACHE
 * (remote sources only) is live: generated at each open, never kept. */
enum tree_doc { DOC_SUMMARY, DOC_METADATA, DOC_TSV, DOC_STATS, DOC_CACHE, DOC_COUNT };

/* 24 bytes: a mount of a million tensors has two million of them (300,000 one-tensor
 * directories: 900,000). Directories use first_child/nchildren, sidecars size_plus1. */
typedef struct node {
    const char *name; /* not NUL-terminated: use name_len */
    uint32_t parent;
    union {
        uint32_t ref;         /* tensor, document, source or view file index (tree_build checks the
                                 range) */
        uint32_t first_child; /* NODE_DIR: children are tree.children[first_child ..+n] */
    };
    union {
        uint32_t nchildren;          /* NODE_DIR */
        _Atomic uint32_t size_plus1; /* NODE_SIDECAR, NODE_NPY: size + 1, 0 = not yet known
                                        (nor kept when UINT32_MAX or more) */
    };
    uint32_t name_len : 8; /* at most 255 (NAME_MAX) */
    node_kind kind : 8;
} node;

typedef struct tree {
    const ckpt_catalog *cat;
    const ckpt_hfview *view;
    node *nodes;
    size_t nnodes;
    uint32_t *children;    /* node indexes, sorted by name within each directory */
    struct timespec mtime; /* newest source mtime */
    /* Access follows the sources: a file is readable by whom may read every source it serves.
     * Directories and documents show the headers of all sources (but config and tokenizer
     * files, shown as they are), so they take all of theirs. */
    mode_t all_sources_mode;
    uint32_t *view_src_first; /* view file i's sources: view_srcs[first[i] .. first[i+1]) */
    uint32_t *view_srcs;
    char **owned; /* paths allocated for auxiliary files */
    arena names;  /* sidecar file names */
    size_t nowned;
    /* NAME.npy beside the sidecar NAME.json of a tensor numpy can hold is not stored: its id
     * is nnodes + the sidecar's (tree_node). At a million tensors the nodes, their names and
     * their children entries took 49 MB. */
    bool npy, as_f32;
    size_t nnpy; /* how many there are */
} tree;

/* Room for a node that is not stored, and its name. */
typedef struct node_buf {
    node n;
    char name[256];
} node_buf;

/* Hands over the HF view, or returns a negative errno with err filled. */
typedef int (*tree_view_fn)(void *ctx, const ckpt_hfview **view, ckpt_err *err);

/* The HF view's files go to .ckptfs/hf/, or with hf_root to the root in place of the tensor
 * tree (.ckptfs/ keeps the summary, metadata and table). The view is asked for once the
 * tensors are in, so another thread can build it meanwhile. */
int tree_build(tree *tr, const ckpt_catalog *cat, tree_view_fn get_view, void *view_ctx,
               bool hf_root, bool npy, bool as_f32, ckpt_err *err);
void tree_free(tree *tr);
/* The node of id (an index into nodes, or a .npy beside one: then filled into *buf), or NULL
 * when there is none. */
node *tree_node(const tree *tr, uint32_t id, node_buf *buf);
/* Whether node k (a stored one) is a sidecar with a .npy beside it. */
bool tree_has_npy(const tree *tr, uint32_t k);
/* Child of dir `parent` named name (len bytes), or UINT32_MAX. */
uint32_t tree_lookup(const tree *tr, uint32_t parent, const char *name, size_t len);
/* The permission bits of a node's content: the intersection of its sources' modes. */
mode_t tree_source_mode(const tree *tr, const node *n);

/* What a node shows, the same for every front end (the mount and serve), so that a file has
 * the size, bytes and freshness rule wherever it is read. */

/* Whether the tree shows tensor t as F32, converted on read (built with as_f32). */
bool tree_converted(const tree *tr, const ckpt_tensor *t);
/* The size of node n's content for every kind but NODE_DOC, whose documents the front end makes
 * and sizes (0 for it and for directories). A sidecar or .npy is sized by generating its text
 * once; the size is kept in the node. */
uint64_t tree_node_size(const tree *tr, node *n);
/* The .npy header of t as the tree shows it: of its float32 form when it is read as F32
 * (-o as_dtype=f32), whose .npy then holds the converted values. */
char *tree_npy_header(const tree *tr, const ckpt_tensor *t, size_t *len);
/* The JSON text of sidecar node n as the tree shows it (converted tensors as F32): malloc'd,
 * or NULL without memory. */
char *tree_sidecar_text(const tree *tr, const node *n, size_t *len);
/* The .npy header of t as the tree shows it: of its float32 form when it is read as F32. */
char *tree_npy_header(const tree *tr, const ckpt_tensor *t, size_t *len);
/* Segments of [off, off+len) of a node whose bytes are the catalog's: a tensor as stored (a
 * converted one's stored bytes: the front end converts), a view file, an auxiliary file. 0 at
 * the end and for the other kinds, whose text the front end holds (tree_plan_text). */
size_t tree_plan(const tree *tr, const node *n, uint64_t off, uint64_t len, ckpt_segment *seg,
                 size_t cap, uint64_t *done);
/* The one memory segment of [off, off+len) of text (text_len bytes), 0 at its end. */
size_t tree_plan_text(const char *text, size_t text_len, uint64_t off, uint64_t len,
                      ckpt_segment *seg, size_t cap, uint64_t *done);
/* The source whose whole file node n is, byte for byte (ckpt_source_whole_file, offsets the
 * same, sizes equal, the few bytes the node holds in memory equal to the file's, which it
 * reads to compare): what a front end may hand to the kernel as the file itself (FUSE
 * passthrough). UINT32_MAX when there is none: a synthesized, converted, partial or compressed
 * node, a tar member, a remote object. */
uint32_t tree_node_whole_source(const tree *tr, node *n);
/* Whether every source the node's bytes come from is still the file the catalog read
 * (ckpt_source_current): what opening it checks, so that a source changed in place, replaced
 * or removed since the catalog was opened is refused rather than read through a descriptor of
 * the old file. Generated files (sidecars, documents) and directories: true.
 * With by_range, a view file (which spans many sources) asks only that none of its sources was
 * replaced (ckpt_source_same_file): one changed in place then fails the reads of its own
 * ranges, and the tensors of the other shards stay readable. A front end that can fail a read
 * passes it (the mount); one that sends a status before the bytes cannot (serve). */
bool tree_node_current(const tree *tr, const node *n, bool by_range);

#endif
