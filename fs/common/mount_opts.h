/* The command line the read-only mount (main.c) and the staging mount (stage/stage.c) share:
 * two positional arguments, -f, -d/debug, -s, -h/--help, allow_other and -o max_threads=N.
 * Each mount keeps a mount_opts in its options struct, starts its fuse_opt spec with
 * MOUNT_OPTS_SPEC and hands every key to mount_opts_key first. */
#ifndef CKPTFS_MOUNT_OPTS_H
#define CKPTFS_MOUNT_OPTS_H

#include <fuse_opt.h>
#include <stddef.h>

typedef struct mount_opts {
    char *first;       /* SOURCE of a mount, OUT of a stage */
    char *mountpoint;  /* the second positional argument */
    int extra_args;    /* positional arguments beyond the two */
    char *max_threads; /* as given: each mount checks it (fs/optval.c) */
    int foreground, debug, single, help, allow_other;
} mount_opts;

enum {
    MOUNT_KEY_FOREGROUND = 1000, /* above any key of the mounts' own */
    MOUNT_KEY_DEBUG,
    MOUNT_KEY_SINGLE,
    MOUNT_KEY_HELP,
    MOUNT_KEY_ALLOW_OTHER,
};

/* The fuse_opt entries for a struct `type` that holds a mount_opts as `member`. */
#define MOUNT_OPTS_SPEC(type, member)                                                              \
    {"max_threads=%s", offsetof(type, member.max_threads), 0},                                     \
        FUSE_OPT_KEY("-f", MOUNT_KEY_FOREGROUND), FUSE_OPT_KEY("-d", MOUNT_KEY_DEBUG),             \
        FUSE_OPT_KEY("debug", MOUNT_KEY_DEBUG), FUSE_OPT_KEY("-s", MOUNT_KEY_SINGLE),              \
        FUSE_OPT_KEY("-h", MOUNT_KEY_HELP), FUSE_OPT_KEY("--help", MOUNT_KEY_HELP),                \
        FUSE_OPT_KEY("allow_other", MOUNT_KEY_ALLOW_OTHER)

enum { MOUNT_OPTS_NOT_MINE = 2 };

/* For a fuse_opt_proc: what it should return for key (0 drop the argument, 1 pass it on to
 * libfuse), or MOUNT_OPTS_NOT_MINE when key is the mount's own. */
int mount_opts_key(mount_opts *m, const char *arg, int key);
void mount_opts_free(mount_opts *m);

#endif
