/* The part the bench's bare FUSE daemons share (passthrough.c, walkfloor.c): mount the session
 * and serve it with the loop ckptfs uses (clone_fd multithreaded, or -s), so that they differ
 * from ckptfs only in what they answer. */
#ifndef CKPTFS_BENCH_SESSION_H
#define CKPTFS_BENCH_SESSION_H

#include <fuse_lowlevel.h>
#include <stdlib.h>

/* Serves ops at co->mountpoint with `mount_opts` (e.g. "-oro,fsname=x") added to args;
 * mounted(mnt) runs right after the mount when not NULL. Frees args and co->mountpoint.
 * Returns the process's exit status. */
static int bench_serve(struct fuse_args *args, struct fuse_cmdline_opts *co,
                       const struct fuse_lowlevel_ops *ops, size_t ops_size, const char *mount_opts,
                       unsigned max_idle_threads, void (*mounted)(const char *mnt)) {
    struct fuse_session *se = NULL;
    int ret = 1;
    fuse_opt_add_arg(args, mount_opts);
    if (!(se = fuse_session_new(args, ops, ops_size, NULL))) goto out;
    if (fuse_set_signal_handlers(se) != 0 || fuse_session_mount(se, co->mountpoint) != 0) goto out;
    if (mounted) mounted(co->mountpoint);
    fuse_daemonize(co->foreground);
    struct fuse_loop_config lc = {.clone_fd = 1, .max_idle_threads = max_idle_threads};
    ret = co->singlethread ? fuse_session_loop(se) : fuse_session_loop_mt(se, &lc);
    fuse_session_unmount(se);
out:
    if (se) {
        fuse_remove_signal_handlers(se);
        fuse_session_destroy(se);
    }
    free(co->mountpoint);
    fuse_opt_free_args(args);
    return ret ? 1 : 0;
}

#endif
