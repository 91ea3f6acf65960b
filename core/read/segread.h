/* Reading planned segments into memory, for every consumer of ckpt_plan (FUSE READ, writers,
 * `ckptfs cat`).
 *
 * A tensor consolidated from shards split on an inner dimension plans one short segment per
 * row fragment, alternating between the shard files. Reading each with its own pread costs a
 * system call per few KiB; here the fragments of one source that lie densely in a window are
 * read with one call into scratch memory and copied to their places. */
#ifndef CKPT_SEGREAD_H
#define CKPT_SEGREAD_H

#include "../ckpt.h"

enum {
    SEGREAD_SCRATCH = 1 << 20, /* the window one gathered read may span */
};

/* Fills dst with the bytes of seg[0..n) in order (dst holds their total length). scratch holds
 * SEGREAD_SCRATCH bytes, or is NULL to read segment by segment. Returns 0, or -EIO for a hole,
 * a source that ended early or one that changed since it was opened (checked once per source,
 * after reading), or another negative errno. */
int ckpt_read_segments(const ckpt_catalog *cat, const ckpt_segment *seg, size_t n, char *dst,
                       char *scratch);

/* Lets reads use worker threads: .zst frames decompressed ahead of sequential readers, strided
 * bands filled by several threads. Off until called, so that a daemon calls it after it has
 * forked (threads do not survive a fork, and forking while they run is not safe everywhere). */
void ckpt_read_workers_allow(void);

#endif
