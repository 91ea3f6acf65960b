/* Bare read-only FUSE passthrough over one flat directory: the ceiling ckptfs is measured against.
 * Usage: passthrough SRCDIR MNT [-f] [-s] [-o readahead_kb=N] [-o splice]
 * Same read-path settings as ckptfs: low-level API, clone_fd multithreaded loop, long timeouts,
 * keep_cache, 1 MiB max_readahead/max_write. READ is one pread into a per-thread buffer, or with
 * -o splice a FUSE_BUF_IS_FD bufvec sent with fuse_reply_data. */
#define FUSE_USE_VERSION 35
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "bench_session.h"

#define TIMEOUT 86400.0
struct ent {
    char *name;
    struct stat st;
};
static struct ent *ents; /* ents[0] = root (ino 1); file i has ino i + 1 */
static size_t nents;
static int dirfd_src = -1;
static pthread_key_t buf_key;
struct opts {
    unsigned ra_kb;
    int splice;
    const char *src;
};
static struct opts o;

static const struct fuse_opt opt_spec[] = {{"readahead_kb=%u", offsetof(struct opts, ra_kb), 0},
                                           {"splice", offsetof(struct opts, splice), 1},
                                           FUSE_OPT_END};

static int opt_proc(void *data, const char *arg, int key, struct fuse_args *outargs) {
    (void)data, (void)outargs;
    if (key == FUSE_OPT_KEY_NONOPT && !o.src) { /* first positional argument: SRCDIR */
        o.src = arg;
        return 0;
    }
    return 1; /* keep the rest for fuse_parse_cmdline (MNT, -f, -s, -o ...) */
}

static struct ent *ent_of(fuse_ino_t ino) {
    return ino >= 1 && ino <= nents ? &ents[ino - 1] : NULL;
}

static void pt_init(void *ud, struct fuse_conn_info *conn) {
    (void)ud;
    /* The kernel caps the BDI readahead at max_readahead when it handles this reply, and
     * set_readahead() has already written read_ahead_kb by then: make room for N > 1 MiB. */
    conn->max_readahead = o.ra_kb > 1024 ? o.ra_kb * 1024 : 1 << 20;
    conn->max_write = 1 << 20;
    if (o.splice) conn->want |= conn->capable & (FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE);
}

static void pt_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
    struct fuse_entry_param e = {.attr_timeout = TIMEOUT, .entry_timeout = TIMEOUT};
    for (size_t i = 1; parent == 1 && i < nents; i++)
        if (strcmp(ents[i].name, name) == 0) {
            e.ino = i + 1, e.attr = ents[i].st;
            fuse_reply_entry(req, &e);
            return;
        }
    fuse_reply_entry(req, &e); /* ino 0 = cached negative entry */
}

static void pt_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)fi;
    struct ent *e = ent_of(ino);
    if (e)
        fuse_reply_attr(req, &e->st, TIMEOUT);
    else
        fuse_reply_err(req, ENOENT);
}

static void pt_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                       struct fuse_file_info *fi) {
    (void)fi;
    if (ino != 1) {
        fuse_reply_err(req, ENOTDIR);
        return;
    }
    char *buf = malloc(size ? size : 1);
    size_t used = 0;
    if (!buf) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    /* offsets: 1 = after ".", 2 = after "..", i + 2 = after file i */
    for (off_t i = off; i < (off_t)nents + 1; i++) {
        const char *name = i == 0 ? "." : i == 1 ? ".." : ents[i - 1].name;
        struct stat st = {.st_ino = i < 2 ? 1 : (ino_t)i, .st_mode = i < 2 ? S_IFDIR : S_IFREG};
        size_t n = fuse_add_direntry(req, buf + used, size - used, name, &st, i + 1);
        if (n > size - used) break;
        used += n;
    }
    fuse_reply_buf(req, buf, used);
    free(buf);
}

static void pt_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    struct ent *e = ent_of(ino);
    if (!e || ino == 1) {
        fuse_reply_err(req, e ? EISDIR : ENOENT);
        return;
    }
    if ((fi->flags & O_ACCMODE) != O_RDONLY) {
        fuse_reply_err(req, EROFS);
        return;
    }
    int fd = openat(dirfd_src, e->name, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fuse_reply_err(req, errno);
        return;
    }
    fi->fh = (uint64_t)fd, fi->keep_cache = 1;
    if (fuse_reply_open(req, fi) == -ENOENT) close(fd); /* open was interrupted */
}

static void pt_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                    struct fuse_file_info *fi) {
    struct ent *e = ent_of(ino);
    off_t end = e ? e->st.st_size : 0;
    size = off >= end ? 0 : (size_t)(end - off) < size ? (size_t)(end - off) : size;
    if (o.splice) {
        struct fuse_bufvec bv = FUSE_BUFVEC_INIT(size);
        bv.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
        bv.buf[0].fd = (int)fi->fh, bv.buf[0].pos = off;
        fuse_reply_data(req, &bv, FUSE_BUF_SPLICE_MOVE);
        return;
    }
    size_t *buf = pthread_getspecific(buf_key); /* buf[0] = capacity, data from buf + 1 */
    if (!buf || buf[0] < size) {
        free(buf);
        if (!(buf = malloc(sizeof(size_t) + size))) {
            fuse_reply_err(req, ENOMEM);
            return;
        }
        buf[0] = size;
        pthread_setspecific(buf_key, buf);
    }
    size_t got = 0;
    while (got < size) {
        ssize_t n = pread((int)fi->fh, (char *)(buf + 1) + got, size - got, off + (off_t)got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            fuse_reply_err(req, errno);
            return;
        }
        if (n == 0) break;
        got += (size_t)n;
    }
    fuse_reply_buf(req, (char *)(buf + 1), got);
}

static void pt_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)ino;
    close((int)fi->fh);
    fuse_reply_err(req, 0);
}

static void pt_statfs(fuse_req_t req, fuse_ino_t ino) {
    (void)ino;
    struct statvfs sv;
    if (fstatvfs(dirfd_src, &sv) == 0)
        fuse_reply_statfs(req, &sv);
    else
        fuse_reply_err(req, errno);
}

static const struct fuse_lowlevel_ops ops = {.init = pt_init,
                                             .lookup = pt_lookup,
                                             .getattr = pt_getattr,
                                             .readdir = pt_readdir,
                                             .open = pt_open,
                                             .read = pt_read,
                                             .release = pt_release,
                                             .statfs = pt_statfs};

/* Set the mount's BDI read_ahead_kb: find MNT's major:minor in mountinfo (last match = topmost). */
static void set_readahead(const char *mnt, unsigned kb) {
    FILE *f = fopen("/proc/self/mountinfo", "r");
    char line[8192], dev[64] = "", mp[PATH_MAX], path[128];
    unsigned maj, min;
    while (f && fgets(line, sizeof line, f)) {
        if (sscanf(line, "%*s %*s %u:%u %*s %4095s", &maj, &min, mp) != 3) continue;
        char *w = mp; /* decode \ooo escapes in place */
        for (char *r = mp; *r; w++)
            if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] && r[3]) {
                *w = (char)(((r[1] - '0') << 6) | ((r[2] - '0') << 3) | (r[3] - '0'));
                r += 4;
            } else
                *w = *r++;
        *w = '\0';
        if (strcmp(mp, mnt) == 0) snprintf(dev, sizeof dev, "%u:%u", maj, min);
    }
    if (f) fclose(f);
    snprintf(path, sizeof path, "/sys/class/bdi/%s/read_ahead_kb", dev);
    FILE *s = dev[0] ? fopen(path, "w") : NULL;
    int ok = s && fprintf(s, "%u\n", kb) > 0;
    if (s && fclose(s) != 0) ok = 0;
    if (!ok)
        fprintf(stderr, "passthrough: could not set %s to %u: %s\n",
                dev[0] ? path : "read_ahead_kb (mount not in mountinfo)", kb, strerror(errno));
}

static unsigned readahead_kb; /* -o readahead_kb, applied once mounted */

static void apply_readahead(const char *mnt) {
    set_readahead(mnt, readahead_kb);
}

static int cmp_ent(const void *a, const void *b) {
    return strcmp(((const struct ent *)a)->name, ((const struct ent *)b)->name);
}

static int load_dir(const char *src) {
    DIR *d = NULL;
    struct stat st;
    if ((dirfd_src = open(src, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0 ||
        fstat(dirfd_src, &st) != 0 || !(d = opendir(src)) || !(ents = calloc(1, sizeof *ents)))
        return -1;
    ents[0] = (struct ent){.name = "", .st = st};
    nents = 1;
    for (struct dirent *de; (de = readdir(d));) {
        if (fstatat(dirfd_src, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
            continue; /* flat: regular files only */
        if (!(ents = realloc(ents, (nents + 1) * sizeof *ents))) return -1;
        ents[nents++] = (struct ent){.name = strdup(de->d_name), .st = st};
    }
    closedir(d);
    qsort(ents + 1, nents - 1, sizeof *ents, cmp_ent);
    for (size_t i = 0; i < nents; i++) ents[i].st.st_ino = i + 1;
    return 0;
}

int main(int argc, char *argv[]) {
    struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
    struct fuse_cmdline_opts co = {0};
    if (fuse_opt_parse(&args, &o, opt_spec, opt_proc) != 0 || fuse_parse_cmdline(&args, &co) != 0)
        return 1;
    if (!o.src || !co.mountpoint) {
        fprintf(stderr, "usage: %s SRCDIR MNT [-f] [-s] [-o readahead_kb=N] [-o splice]\n",
                argv[0]);
        goto fail;
    }
    if (load_dir(o.src) != 0) {
        fprintf(stderr, "passthrough: %s: %s\n", o.src, strerror(errno));
        goto fail;
    }
    pthread_key_create(&buf_key, free);
    readahead_kb = o.ra_kb;
    return bench_serve(&args, &co, &ops, sizeof ops, "-oro,default_permissions,fsname=passthrough",
                       10, o.ra_kb ? apply_readahead : NULL);
fail:
    free(co.mountpoint);
    fuse_opt_free_args(&args);
    return 1;
}
