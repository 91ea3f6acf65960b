/* State shared by the FUSE operations of one mount. */
#ifndef CKPTFS_H
#define CKPTFS_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <pthread.h>
#include <stdbool.h>

#include "tree.h"

typedef struct ckptfs {
    ckpt_catalog *cat;
    tree tr;
    double timeout;        /* entry/attr/negative cache, seconds: the content never changes */
    bool splice;           /* reply to READ by splicing from the source instead of one copy */
    unsigned readahead_kb; /* 0 = keep the kernel's default */
    uid_t uid;
    gid_t gid;
    pthread_mutex_t doc_lock; /* guards docs[] while they are built on first use */
    char *docs[DOC_COUNT];
    size_t doc_len[DOC_COUNT];
} ckptfs;

extern const struct fuse_lowlevel_ops ckptfs_ops;

#endif
