/* FUSE passthrough through the kernel interface itself, since libfuse 3.14 predates it
 * (kernel 6.9+, include/uapi/linux/fuse.h 7.40): the INIT reply asks for FUSE_PASSTHROUGH, a
 * backing file is registered with FUSE_DEV_IOC_BACKING_OPEN, and an OPEN reply carrying
 * FOPEN_PASSTHROUGH and its backing id makes the kernel read and mmap that file directly, the
 * daemon never asked again. libfuse's replies are edited on their way out through its custom
 * I/O hooks (fuse_session_custom_io), which see every message the session writes.
 *
 * One session per process: the state is the process's. */
#ifndef CKPTFS_PASSTHROUGH_H
#define CKPTFS_PASSTHROUGH_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <stdbool.h>

typedef enum {
    PASSTHROUGH_AUTO, /* when the kernel and privileges allow, else the daemon path */
    PASSTHROUGH_OFF,  /* never: the hooks are not even installed */
    PASSTHROUGH_ON,   /* or the mount fails (passthrough_refused says why) */
} passthrough_mode;

/* "auto", "off", "on" (NULL = auto) into *mode; false for anything else. */
bool passthrough_parse_mode(const char *text, passthrough_mode *mode);

/* Installs the hooks on se's device, after fuse_session_mount and before INIT is read: 0, or a
 * negative errno. Nothing is done for PASSTHROUGH_OFF. */
int passthrough_install(struct fuse_session *se, passthrough_mode mode);

/* After the INIT reply went out: NULL when passthrough works on this mount, else what the
 * kernel answered (a static string). */
const char *passthrough_refused(void);

/* Registers fd (a regular file, which the kernel keeps open) as a backing file: its id (> 0),
 * or a negative errno (-ELOOP: it lies on a stacked file system). */
int passthrough_backing_open(int fd);

/* The next OPEN reply this thread sends opens the file in passthrough mode on backing_id. */
void passthrough_next_open(int backing_id);

#endif
