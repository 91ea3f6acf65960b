/* What the pack's commits share (stage_pack_write.c; stage_pack.c: one safetensors OUT;
 * stage_pack_dir.c: an HF directory OUT whose shards are packs; stage_pack_clone.c). */
#ifndef CKPTFS_STAGE_PACK_H
#define CKPTFS_STAGE_PACK_H

#include "stage_fs.h"

#include "core/write/packed.h"

typedef ckpt_placed placed; /* a tensor and its place in a pack */

enum { PACK_COPY_BUF = CKPT_PACKED_BUF };

enum { PACK_NONE = -1, PACK_UNKNOWN = 0, PACK_FILE = 1, PACK_DIR = 2 };
/* Whether OUT can be made of packs, and how (under st->lock). */
int stage_pack_mode(stage *st);
/* A new, empty pack becomes the one files are appended to (under st->lock): 0 or an errno. */
int pack_open_new(stage *st);

int placed_cmp(const void *a, const void *b);
/* The end of the last byte any file under dir keeps in pack id (under st->lock). */
uint64_t pack_live_end(const snode *dir, uint64_t id);
int pack_pwrite_all(int fd, const void *p, size_t n, uint64_t at);
int pack_fsync_parent(const char *path);
/* Before a commit over its own source puts the file fd (or, fd < 0, path) in place as OUT:
 * spool_note_landing. 0 or -errno. */
int note_landing(stage *st, int fd, const char *path);

/* The file fd (spool data file id) becomes OUT: a second name made beside OUT, then renamed
 * over it, the directory fsynced. 0 or -errno with err filled. */
int pack_publish(stage *st, int fd, uint64_t id, ckpt_err *err);

/* stage_pack_clone.c: OUT as a clone of the source's file with the changed tensors written
 * into it, where the file system shares extents: 0, 1 (not such a tree, or no FICLONE here:
 * the pack's way), or -errno with err filled. */
int stage_pack_clone_commit(stage *st, ckpt_catalog *cat, ckpt_err *err);

/* stage_pack_dir.c: stage_pack_commit for a directory OUT. */
int stage_pack_dir_commit(stage *st, ckpt_catalog *cat, const ckpt_write_opts *opts, ckpt_err *err);

#endif
