/* The one call between two front ends: the read-only mount's command line takes -o stage=OUT,
 * so that mount(8) and fstab, which know only SOURCE MOUNTPOINT -o OPTIONS, can make a staging
 * mount; it hands the request to the stage front end through this contract, not through the
 * stage's headers. (The call goes one way: nothing of fs/stage calls fs/mount.) */
#ifndef CKPTFS_STAGE_REQUEST_H
#define CKPTFS_STAGE_REQUEST_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <stdbool.h>

/* What a staging mount is made of, whichever command line asked for it: `ckptfs stage OUT
 * MOUNTPOINT [--from SOURCE]` or `ckptfs SOURCE MOUNTPOINT -o stage=OUT`. Strings as given. */
typedef struct stage_request {
    const char *out;
    const char *mountpoint;
    const char *from;           /* the source checkpoint, or NULL for an empty stage */
    const char *spool;          /* -o spool=DIR, or NULL for .OUT.stage next to OUT */
    const char *max_shard_size; /* -o max_shard_size=S (HF directory OUT), or NULL */
    unsigned max_threads;       /* 0: the stage's default (1) */
    bool nocommit, foreground, single;
} stage_request;

/* Checks the request, mounts, detaches (unless foreground) and serves until unmounted, then
 * commits what is left. args holds the FUSE options the caller did not take (-d, allow_other,
 * fsname=, ...); the caller frees it. Returns the exit status (STAGE_* of stage_fs.h). */
int stage_mount(const stage_request *req, struct fuse_args *args);

#endif
