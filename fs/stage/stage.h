/* The staging mount: a writable tree whose tensors are packed into a new archive on commit. */
#ifndef CKPTFS_STAGE_H
#define CKPTFS_STAGE_H

#include "common/stage_request.h"

/* argv[0] is "stage" / "commit". Return the process exit status. */
int stage_main(int argc, char **argv);
int commit_main(int argc, char **argv);
/* `ckptfs stage --status OUT [-o spool=DIR]` and `ckptfs umount MOUNTPOINT` (stage_status.c). */
int stage_status_main(int argc, char **argv);
int umount_main(int argc, char **argv);
/* The spool of `ckptfs stage OUT` (-o spool=DIR as spool_opt, or NULL); NULL after saying on
 * stderr why OUT cannot be staged. */
char *stage_spool_of(const char *out, const char *spool_opt);

#endif
