#include "passthrough.h"

#include <errno.h>
#include <linux/fuse.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

/* The kernel interface of protocol 7.40, which Debian 12's <linux/fuse.h> (7.38) predates:
 * declared here under our own names, the layouts checked against the 7.38 ones they extend. */
enum {
    PT_INIT_PASSTHROUGH_FLAGS2 = 1u << (37 - 32), /* FUSE_PASSTHROUGH, bit 37 of the flags */
    PT_FOPEN_PASSTHROUGH = 1u << 7,
    /* How many file systems a backing file may lie under, this one included: 1 takes files
     * of a plain file system and keeps the mount usable as an overlayfs layer; a source on
     * overlayfs (depth 1 already) is refused (ELOOP) and served by the daemon. */
    PT_MAX_STACK_DEPTH = 1,
};

struct pt_init_out { /* fuse_init_out, 7.40 */
    uint32_t major, minor, max_readahead, flags;
    uint16_t max_background, congestion_threshold;
    uint32_t max_write, time_gran;
    uint16_t max_pages, map_alignment;
    uint32_t flags2, max_stack_depth;
    uint32_t unused[6];
};
_Static_assert(sizeof(struct pt_init_out) == sizeof(struct fuse_init_out), "fuse_init_out");
_Static_assert(offsetof(struct pt_init_out, flags2) == offsetof(struct fuse_init_out, flags2),
               "flags2");

struct pt_open_out { /* fuse_open_out, 7.40: the padding became backing_id */
    uint64_t fh;
    uint32_t open_flags;
    int32_t backing_id;
};
_Static_assert(sizeof(struct pt_open_out) == sizeof(struct fuse_open_out), "fuse_open_out");

struct pt_backing_map {
    int32_t fd;
    uint32_t flags;
    uint64_t padding;
};
#define PT_DEV_IOC_BACKING_OPEN _IOW(229, 1, struct pt_backing_map)
#define PT_DEV_IOC_BACKING_CLOSE _IOW(229, 2, uint32_t)

static struct {
    passthrough_mode mode;
    int fd; /* the session's device */
    /* Written by the thread that reads INIT, before the INIT reply; read after it. */
    uint64_t init_unique;
    bool init_seen, offered;
    uint32_t offered_flags2;
    const char *refused; /* NULL once the probe after INIT succeeded */
    atomic_bool ready;
    char why[256];
} pt = {.fd = -1, .refused = "the INIT request was not seen"};

/* An OPEN reply to patch: set just before fuse_reply_open on the same thread, taken by the
 * writev it makes (each reply is one writev, on the thread that answers). */
static _Thread_local int next_backing_id;

bool passthrough_parse_mode(const char *text, passthrough_mode *mode) {
    if (!text || strcmp(text, "auto") == 0)
        *mode = PASSTHROUGH_AUTO;
    else if (strcmp(text, "off") == 0)
        *mode = PASSTHROUGH_OFF;
    else if (strcmp(text, "on") == 0)
        *mode = PASSTHROUGH_ON;
    else
        return false;
    return true;
}

static ssize_t hook_read(int fd, void *buf, size_t len, void *userdata) {
    (void)userdata;
    ssize_t r = read(fd, buf, len);
    if (!pt.init_seen &&
        r >= (ssize_t)(sizeof(struct fuse_in_header) + sizeof(struct fuse_init_in))) {
        const struct fuse_in_header *in = buf;
        if (in->opcode == FUSE_INIT) {
            const struct fuse_init_in *arg = (const void *)(in + 1);
            pt.init_seen = true;
            pt.init_unique = in->unique;
            pt.offered_flags2 = arg->flags & FUSE_INIT_EXT ? arg->flags2 : 0;
            pt.offered = arg->major == 7 && (pt.offered_flags2 & PT_INIT_PASSTHROUGH_FLAGS2);
            if (!pt.offered)
                snprintf(pt.why, sizeof pt.why,
                         "the kernel's INIT (protocol %u.%u, flags2 0x%x) does not offer "
                         "FUSE_PASSTHROUGH (Linux 6.9+ with CONFIG_FUSE_PASSTHROUGH)",
                         arg->major, arg->minor, pt.offered_flags2);
        }
    }
    return r;
}

/* Right after the INIT reply the kernel has set up the connection: one registration of an
 * anonymous file says whether backing files are allowed (CAP_SYS_ADMIN). */
static void probe_backing(void) {
    int fd = memfd_create("ckptfs-passthrough-probe", MFD_CLOEXEC);
    if (fd < 0) {
        snprintf(pt.why, sizeof pt.why, "memfd_create for the probe: %s", strerror(errno));
        pt.refused = pt.why;
        return;
    }
    int id = passthrough_backing_open(fd);
    close(fd);
    if (id < 0) {
        snprintf(pt.why, sizeof pt.why, "FUSE_DEV_IOC_BACKING_OPEN: %s%s", strerror(-id),
                 id == -EPERM ? " (the kernel requires CAP_SYS_ADMIN in the initial user "
                                "namespace, or refused FUSE_PASSTHROUGH in the INIT reply)"
                              : "");
        pt.refused = pt.why;
        return;
    }
    uint32_t u = (uint32_t)id;
    ioctl(pt.fd, PT_DEV_IOC_BACKING_CLOSE, &u);
    pt.refused = NULL;
    atomic_store_explicit(&pt.ready, true, memory_order_release);
}

static ssize_t hook_writev(int fd, struct iovec *iov, int count, void *userdata) {
    (void)userdata;
    int backing = next_backing_id;
    next_backing_id = 0;
    const struct fuse_out_header *out = iov[0].iov_base;
    bool init = false;
    if (count >= 2 && iov[0].iov_len >= sizeof *out && out->error == 0) {
        if (backing > 0 && iov[1].iov_len == sizeof(struct pt_open_out)) {
            struct pt_open_out *o = iov[1].iov_base;
            o->open_flags |= PT_FOPEN_PASSTHROUGH;
            o->backing_id = backing;
        } else if (pt.init_seen && !pt.ready && out->unique == pt.init_unique &&
                   iov[1].iov_len == sizeof(struct pt_init_out)) {
            struct pt_init_out *o = iov[1].iov_base;
            if (pt.offered && (o->flags & FUSE_INIT_EXT)) {
                o->flags2 |= PT_INIT_PASSTHROUGH_FLAGS2;
                o->max_stack_depth = PT_MAX_STACK_DEPTH;
                init = true;
            }
            pt.refused = pt.offered ? "libfuse did not answer INIT with FUSE_INIT_EXT" : pt.why;
        }
    }
    ssize_t r = writev(fd, iov, count);
    if (init && r >= 0) probe_backing();
    return r;
}

static ssize_t hook_splice_receive(int fdin, off_t *offin, int fdout, off_t *offout, size_t len,
                                   unsigned int flags, void *userdata) {
    (void)userdata;
    return splice(fdin, offin, fdout, offout, len, flags);
}

static ssize_t hook_splice_send(int fdin, off_t *offin, int fdout, off_t *offout, size_t len,
                                unsigned int flags, void *userdata) {
    (void)userdata;
    return splice(fdin, offin, fdout, offout, len, flags);
}

int passthrough_install(struct fuse_session *se, passthrough_mode mode) {
    pt.mode = mode;
    if (mode == PASSTHROUGH_OFF) {
        pt.refused = "-o passthrough=off";
        return 0;
    }
    /* The splice hooks only do what libfuse does without custom I/O, which without them
     * would stop offering splice (-o splice). */
    static const struct fuse_custom_io io = {.read = hook_read,
                                             .writev = hook_writev,
                                             .splice_receive = hook_splice_receive,
                                             .splice_send = hook_splice_send};
    pt.fd = fuse_session_fd(se);
    return fuse_session_custom_io(se, &io, pt.fd);
}

const char *passthrough_refused(void) {
    return atomic_load_explicit(&pt.ready, memory_order_acquire) ? NULL : pt.refused;
}

int passthrough_backing_open(int fd) {
    struct pt_backing_map map = {.fd = fd};
    int id = ioctl(pt.fd, PT_DEV_IOC_BACKING_OPEN, &map);
    return id > 0 ? id : id == 0 ? -EIO : -errno;
}

void passthrough_next_open(int backing_id) {
    next_backing_id = backing_id;
}
