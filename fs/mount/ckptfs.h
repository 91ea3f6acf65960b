/* State shared by the FUSE operations of one mount. */
#ifndef CKPTFS_H
#define CKPTFS_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <pthread.h>
#include <stdbool.h>

#include "core/views/tree.h"

/* A generated file held by an open handle. */
typedef struct open_doc {
    char *text;
    size_t len;
    ckpt_vfile vf; /* .npy files: the header in text, then the tensor */
    struct open_doc *next, **prev;
} open_doc;

typedef struct ckptfs {
    ckpt_catalog *cat;
    tree tr;
    double timeout;        /* entry/attr/negative cache, seconds: the content never changes */
    bool splice;           /* reply to READ by splicing from the source instead of one copy */
    unsigned readahead_kb; /* 0 = keep the kernel's default */
    bool npy;              /* show NAME.npy next to tensors numpy can hold */
    bool no_opendir;       /* the kernel may skip OPENDIR/RELEASEDIR (see op_init) */
    bool as_f32;           /* -o as_dtype=f32: narrow and quantized tensors read as F32 */
    bool view_at_root;     /* -o view=hf: the HF view's files are the mount's content */
    bool passthrough;      /* -o passthrough=auto|on: may open files in passthrough mode */
    /* Per source: its backing id once registered (> 0), 0 not tried yet, < 0 refused. The
     * kernel wants every passthrough open of an inode on the same backing, so it is kept. */
    int *backing;
    pthread_mutex_t backing_lock;
    bool *alias; /* per tensor: its bytes are an earlier tensor's (tied weights) */
    uid_t uid;
    gid_t gid;
    mode_t umask;                /* -o umask=: bits taken off every mode */
    pthread_mutex_t doc_lock;    /* guards docs[] (built on first use), open_docs, sha256 */
    unsigned char (*sha256)[33]; /* per tensor: [0] = known, [1..32] = digest; made on demand */
    struct ckpt_stats *stats;    /* per tensor, valid where stats_known (user.ckpt.stats) */
    bool *stats_known;
    struct ckpt_stats_pages *stats_pages; /* .ckptfs/stats.json, once built */
    ckpt_tsv_pages *tsv_pages;            /* .ckptfs/tensors.tsv, once measured */
    pthread_mutex_t stats_lock;           /* one statistics job at a time: each uses every CPU */
    struct fuse_session *se;              /* to tell the kernel stats.json got its size */
    open_doc *open_docs;
    char *docs[DOC_COUNT];
    size_t doc_len[DOC_COUNT];
} ckptfs;

extern const struct fuse_lowlevel_ops ckptfs_ops;
void ckptfs_free_open_docs(ckptfs *fs);

#endif
