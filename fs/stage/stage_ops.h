/* What the FUSE operations of the staging mount share (stage_ops.c, stage_io.c). */
#ifndef CKPTFS_STAGE_OPS_H
#define CKPTFS_STAGE_OPS_H

#include "stage_fs.h"

enum { MAX_IO = 1 << 20, NAME_MAX_BYTES = 255 };

#define CONTROL_NAME ".ckptfs"

typedef struct handle {
    snode *node;
    char *text; /* generated content: a source sidecar, the status, a commit report */
    size_t len;
    /* The source tensor a node referred to at open: a commit that replaces the source moves
     * the node to the new one, and the handle keeps reading the old (kept open) until closed. */
    const ckpt_catalog *cat;
    size_t lower;
    bool writer; /* opened for writing: its close reports a write that failed late */
    /* Every open handle is on the stage's list: a handle the kernel never releases (the
     * connection aborted, a reply that did not reach an interrupted opener) is freed at the end
     * instead of leaking. */
    struct handle *next, **prev;
} handle;

/* Puts h on the stage's list of open handles, or, when the reply that carried it to the kernel
 * failed, releases it at once (no RELEASE will come for it). */
void handle_track(stage *st, handle *h);
void handle_untrack(stage *st, handle *h);
/* What RELEASE does: the node's open count, its descriptor, the handle's memory. */
void handle_release(stage *st, handle *h);

static inline stage *st_of(fuse_req_t req) {
    return fuse_req_userdata(req);
}

static inline snode *node_of(stage *st, fuse_ino_t ino) {
    return ino == FUSE_ROOT_ID ? st->root : (snode *)(uintptr_t)ino;
}

static inline fuse_ino_t ino_of(const stage *st, const snode *n) {
    return n == st->root ? FUSE_ROOT_ID : (fuse_ino_t)(uintptr_t)n;
}

static inline bool is_control(const snode *n) {
    return n->kind == SN_CONTROL_DIR || n->kind == SN_COMMIT || n->kind == SN_STATUS;
}

static inline handle *handle_of(struct fuse_file_info *fi) {
    return (handle *)(uintptr_t)fi->fh;
}

/* ---- the gate: changes wait for no commit, they are refused during one ---- */

static inline bool gate_enter(stage *st) {
    return pthread_rwlock_tryrdlock(&st->gate) == 0;
}

static inline void gate_leave(stage *st) {
    pthread_rwlock_unlock(&st->gate);
}

/* The first change after a commit is journaled, so a replay knows OUT is behind. */
static inline void note_uncommitted_change(stage *st) {
    if (!st->dirty && journal_mark(st, 'w') == 0) st->dirty = true;
}

/* stage_io.c */
/* Waits until the pack writes answered so far are made (never under st->lock). */
void stage_wb_drain(stage *st);
/* Takes st->lock with no pack write outstanding (for truncations and moves). */
void stage_lock_drained(stage *st);
int stage_set_size(stage *st, snode *n, uint64_t size); /* under st->lock and the gate */
void stage_op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void stage_op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                   struct fuse_file_info *fi);
void stage_op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
                    struct fuse_file_info *fi);
void stage_op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void stage_op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void stage_op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi);
void stage_op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length,
                        struct fuse_file_info *fi);

#endif
