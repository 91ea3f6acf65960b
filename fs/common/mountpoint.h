/* Checks of a mount point before anything is mounted on it, shared by both mounts. */
#ifndef CKPTFS_MOUNTPOINT_H
#define CKPTFS_MOUNTPOINT_H

#include "core/ckpt.h"

#include <stdbool.h>

/* Whether path is dir or lies under it (both absolute, resolved). */
bool path_is_under(const char *path, const char *dir);

/* mnt (resolved) can be mounted on: it answers stat as a directory and nothing is mounted on it
 * (a live mount there is named, with its source). A FUSE mount left behind by a daemon that was
 * killed ("Transport endpoint is not connected") is named, with the command that clears it.
 * Otherwise prints "prog: ..." and returns false. */
bool mountpoint_usable(const char *prog, const char *mnt);

/* Whether something is mounted exactly on mnt (resolved): the topmost mount's file system type
 * ("fuse.ckptfs") and, when source is not NULL, its source as /proc/self/mountinfo names it. */
bool mount_at(const char *mnt, char *type, size_t cap, char *source, size_t source_cap);

/* The source and the mount point are apart: mounting on the source, inside it, or over the
 * directory that holds it would hide the files the daemon reads (and with -s make it wait on
 * itself). source is the path as given; cat, when not NULL, adds every file it has open. */
bool mountpoint_apart(const char *prog, const char *mnt, const char *source,
                      const ckpt_catalog *cat);

#endif
