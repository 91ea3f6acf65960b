/* Running a FUSE daemon the way both mounts (read-only and staging) do: detach from the
 * terminal only once the mount answers, so `ckptfs SRC MNT && ls MNT` works, then serve. */
#ifndef CKPTFS_DAEMON_H
#define CKPTFS_DAEMON_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <stdbool.h>

/* Forks; the parent waits and exits with the status the child reports (mount_failed if the
 * child dies first). Returns 0 in the child, or a negative errno. */
int daemon_detach(unsigned char mount_failed);
/* Tells the waiting parent `status` (once; later calls do nothing) and points stdio at
 * /dev/null. Harmless in the foreground. */
void daemon_report_ready(unsigned char status);

/* Serves the session until unmount: a helper thread stats the mount point (answered only once
 * the kernel has our INIT reply), calls on_ready(ctx, st_dev) if given, and reports success;
 * the loop is multithreaded with clone_fd, or single with `single`. Returns the loop's status
 * (0, or the number of the signal that ended it). */
int daemon_serve(struct fuse_session *se, const char *mountpoint, bool single, unsigned max_threads,
                 void (*on_ready)(void *ctx, dev_t dev), void *ctx);

#endif
