/* Running a FUSE daemon the way both mounts (read-only and staging) do: detach from the
 * terminal only once the mount answers, so `ckptfs SRC MNT && ls MNT` works, then serve. */
#ifndef CKPTFS_DAEMON_H
#define CKPTFS_DAEMON_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <stdbool.h>
#include <stdint.h>

/* Forks; the parent waits and exits with the status the child reports (mount_failed if the
 * child dies first). Returns 0 in the child, or a negative errno. */
int daemon_detach(unsigned char mount_failed);
/* Tells the waiting parent `status` (once; later calls do nothing) and points stdio at
 * /dev/null. Harmless in the foreground. */
void daemon_report_ready(unsigned char status);

typedef struct serve_opts {
    bool single;          /* -s: one thread */
    unsigned max_threads; /* otherwise at most this many (0 = 1) */
    unsigned spin_us;     /* > 0: our loop (fs/loop.h) spinning this long; 0: libfuse's loops */
    uint64_t inline_ops;  /* for our loop: the opcodes whose requests never block */
} serve_opts;

/* Serves the session until unmount: a helper thread stats the mount point (answered only once
 * the kernel has our INIT reply), calls on_ready(ctx, st_dev) if given, and reports success.
 * on_ready returns 0, or an exit status that refuses the mount (having said why on stderr):
 * the session then ends and daemon_serve returns -ECANCELED, the status left for the caller
 * to report. Otherwise returns the loop's status: 0 (unmounted, or ended by a signal;
 * libfuse's loops return the signal's number instead), or a negative errno. */
int daemon_serve(struct fuse_session *se, const char *mountpoint, const serve_opts *so,
                 int (*on_ready)(void *ctx, dev_t dev), void *ctx);

#endif
