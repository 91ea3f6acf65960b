/* The staging mount: a writable tree whose tensors are packed into a new archive on commit. */
#ifndef CKPTFS_STAGE_H
#define CKPTFS_STAGE_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <stdbool.h>

/* argv[0] is "stage" / "commit". Return the process exit status. */
int stage_main(int argc, char **argv);
int commit_main(int argc, char **argv);
/* `ckptfs stage --status OUT [-o spool=DIR]` and `ckptfs umount MOUNTPOINT` (stage_status.c). */
int stage_status_main(int argc, char **argv);
int umount_main(int argc, char **argv);
/* The spool of `ckptfs stage OUT` (-o spool=DIR as spool_opt, or NULL); NULL after saying on
 * stderr why OUT cannot be staged. */
char *stage_spool_of(const char *out, const char *spool_opt);

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
