/* Sources: opening each kind (a local file, a seekable .zst, a tar member, a remote object, bytes
 * made when read), reading them, and checking that they are still what was opened. */
#include "source.h"
#include "../util/err.h"
#include "remote/remote.h"
#include "zstd_seekable.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *source_file_type_name(mode_t mode) {
    switch (mode & S_IFMT) {
    case S_IFREG:
        return "a regular file";
    case S_IFDIR:
        return "a directory";
    case S_IFIFO:
        return "a FIFO";
    case S_IFSOCK:
        return "a socket";
    case S_IFCHR:
        return "a character device";
    case S_IFBLK:
        return "a block device";
    case S_IFLNK:
        return "a symbolic link";
    }
    return "of an unknown type";
}

/* A file that starts like zstd and ends in a seek table is read through it (*zst set, the
 * content size in *size); any other file is read as it is. */
static int attach_seek_table(int fd, const char *path, uint64_t *size, zst_table **zst,
                             ckpt_err *err) {
    unsigned char magic[4];
    *zst = NULL;
    if (*size < sizeof magic || pread(fd, magic, sizeof magic, 0) != (ssize_t)sizeof magic ||
        !zst_magic(magic, sizeof magic))
        return 0;
    int rc = zst_table_open(fd, path, *size, zst, err);
    if (rc < 0) return rc;
    if (rc == 0) *size = zst_content_size(*zst);
    return 0;
}

/* An object behind a URL: pinned now (size, ETag), read later through the block cache. */
static int open_remote(ckpt_source *s, const char *path, char *shown, size_t shown_cap,
                       ckpt_err *err) {
    remote_object *o;
    int rc = remote_open(path, &o, err);
    if (rc) return rc;
    remote_shown(path, shown, shown_cap);
    s->remote = o;
    s->size = remote_size(o);
    s->file_size = s->size;
    s->mtime.tv_sec = remote_mtime(o);
    s->mode = S_IFREG | 0444;
    unsigned char magic[4];
    if (s->size >= sizeof magic && remote_pread(o, magic, sizeof magic, 0) == sizeof magic &&
        zst_magic(magic, sizeof magic)) {
        rc = zst_table_open_remote(o, shown, s->size, &s->zst, err);
        if (rc < 0) {
            remote_close(o);
            s->remote = NULL;
            return rc;
        }
        if (rc == 0) s->size = zst_content_size(s->zst);
    }
    return 0;
}

int source_open(ckpt_source *s, const char *path, char *shown, size_t shown_cap, ckpt_err *err) {
    memset(s, 0, sizeof *s);
    s->fd = -1;
    if (remote_is_url(path)) return open_remote(s, path, shown, shown_cap, err);
    snprintf(shown, shown_cap, "%s", path);
    /* O_NONBLOCK: opening a FIFO named like a shard would wait for a writer forever (and a
     * device could do anything); the type is checked on the descriptor, so no check races. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        int e = errno;
        return ckpt_fail(err, -e, "%s: cannot open: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return ckpt_fail(err, -e, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return ckpt_fail(err, -EINVAL,
                         "%s: %s, not a regular file: ckptfs reads only regular files", path,
                         source_file_type_name(st.st_mode));
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    uint64_t size = (uint64_t)st.st_size;
    zst_table *zst;
    int rc = attach_seek_table(fd, path, &size, &zst, err);
    if (rc) {
        close(fd);
        return rc;
    }
    s->fd = fd;
    s->zst = zst;
    s->size = size;
    s->mtime = st.st_mtim;
    s->ctime = st.st_ctim;
    s->nlink = (uint64_t)st.st_nlink;
    s->mode = st.st_mode;
    s->dev = st.st_dev;
    s->ino = st.st_ino;
    s->file_size = (uint64_t)st.st_size;
    return 0;
}

int source_open_member(ckpt_source *s, const ckpt_source *a, const char *name, uint64_t base,
                       uint64_t size, ckpt_err *err) {
    if (a->zst || a->member_of || a->virt)
        return ckpt_fail(err, -EOPNOTSUPP,
                         "%s: member \"%.120s\": archives are read in place only when they are "
                         "plain files (not compressed, not inside another archive)",
                         a->path, name);
    if (base > a->size || size > a->size - base)
        return ckpt_fail(err, -EINVAL, "%s: member \"%.120s\" at offset %llu runs past the end",
                         a->path, name, (unsigned long long)base);
    int fd = -1;
    if (!a->remote && (fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 0)) < 0) {
        int e = errno;
        return ckpt_fail(err, -e, "%s: %s", a->path, strerror(e));
    }
    *s = *a;
    s->fd = fd;
    /* a remote member shares the archive's pinned object and its cached blocks */
    if (a->remote) s->remote = remote_hold(a->remote);
    s->member_of = a->relpath;
    s->base = base;
    s->size = size;
    return 0;
}

void source_open_virtual(ckpt_source *s, uint64_t size, const ckpt_virtual_ops *ops, void *ctx) {
    memset(s, 0, sizeof *s);
    s->fd = -1;
    s->size = s->file_size = size;
    s->mode = S_IFREG | 07777; /* its bytes come from the other sources, whose modes count */
    s->virt = ops;
    s->virt_ctx = ctx;
}

void source_close(ckpt_source *s) {
    zst_table_free(s->zst);
    remote_close(s->remote);
    if (s->virt) s->virt->release(s->virt_ctx);
    if (s->fd >= 0) close(s->fd);
    s->zst = NULL;
    s->remote = NULL;
    s->virt = NULL;
    s->fd = -1;
}

static bool same_time(const struct timespec *a, const struct timespec *b) {
    return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

/* Takes st's ctime and link count as the file's: a link or unlink moved them, no write did.
 * Under the same seqlock as the owner's own links (odd while the pair is written), so a reader
 * never compares a new ctime with an old count; a writer already at it makes this one a no-op. */
static void adopt_link(ckpt_source *s, unsigned gen, const struct stat *st) {
    if (!__atomic_compare_exchange_n(&s->own_ctime_gen, &gen, gen + 1, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_RELAXED))
        return;
    __atomic_store_n(&s->ctime.tv_sec, st->st_ctim.tv_sec, __ATOMIC_RELAXED);
    __atomic_store_n(&s->ctime.tv_nsec, st->st_ctim.tv_nsec, __ATOMIC_RELAXED);
    __atomic_store_n(&s->nlink, (uint64_t)st->st_nlink, __ATOMIC_RELAXED);
    __atomic_fetch_add(&s->own_ctime_gen, 1, __ATOMIC_RELEASE);
}

/* ctime as the catalog knows it, unless the owner's own link or unlink is under way or ended
 * while it was read (a seqlock: the generation before and after must be the same even one).
 * Any link or unlink by others (another process's commit linking the file into its output)
 * moves ctime and st_nlink but never size, mtime or inode, which the caller compared first;
 * a rewrite, even one that puts mtime back (`cp -p`), and a chmod leave the count as it was. */
static bool ctime_matches(const ckpt_source *s, const struct stat *st) {
    unsigned gen = __atomic_load_n(&s->own_ctime_gen, __ATOMIC_ACQUIRE);
    if (gen & 1) return true;
    struct timespec known = {__atomic_load_n(&s->ctime.tv_sec, __ATOMIC_RELAXED),
                             __atomic_load_n(&s->ctime.tv_nsec, __ATOMIC_RELAXED)};
    uint64_t known_nlink = __atomic_load_n(&s->nlink, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&s->own_ctime_gen, __ATOMIC_RELAXED) != gen) return true;
    if (same_time(&st->st_ctim, &known)) return true;
    if ((uint64_t)st->st_nlink == known_nlink) return false;
    /* The catalog's sources are never const objects, only seen through const pointers. */
    adopt_link((ckpt_source *)s, gen, st);
    return true;
}

bool ckpt_source_stat_matches(const ckpt_source *s, const struct stat *st) {
    if (st->st_dev != s->dev || st->st_ino != s->ino) return false;
    if (s->owned) return true;
    return (uint64_t)st->st_size == ckpt_source_stored_size(s) &&
           same_time(&st->st_mtim, &s->mtime) && ctime_matches(s, st);
}

/* The stat may predate an own link that ended before the comparison (the catalog then knows
 * the new ctime): a mismatch is taken as a change only when a second look agrees. */
static bool file_matches(const ckpt_source *s, int fd) {
    struct stat st;
    for (int look = 0; look < 2; look++) {
        bool got = fd >= 0 ? fstat(fd, &st) == 0 : stat(s->path, &st) == 0;
        if (!got) return false;
        if (ckpt_source_stat_matches(s, &st)) return true;
    }
    return false;
}

int ckpt_source_open_again(const ckpt_source *s) {
    if (__atomic_load_n(&s->seen_changed, __ATOMIC_ACQUIRE)) return -EIO;
    /* O_NONBLOCK: a FIFO put in the source's place must not hold the open forever. */
    int fd = open(s->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return -errno;
    if (!file_matches(s, fd)) {
        close(fd); /* another file by now: never its bytes under the old description */
        return -EIO;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

bool ckpt_source_unchanged(const ckpt_source *s) {
    if (s->virt) return true; /* its reads check the sources they are made from */
    if (s->remote) return !ckpt_source_remote_changed(s); /* pinned ETag and size */
    if (__atomic_load_n(&s->seen_changed, __ATOMIC_ACQUIRE)) return false;
    /* A source kept without a descriptor (a staged file, opened per read) is looked up by
     * path, and must still be the same file. */
    return file_matches(s, s->fd);
}

bool ckpt_source_current(const ckpt_source *s) {
    struct stat st;
    if (s->remote || s->virt) return ckpt_source_unchanged(s);
    return stat(s->path, &st) == 0 && ckpt_source_stat_matches(s, &st) && ckpt_source_unchanged(s);
}

bool ckpt_source_same_file(const ckpt_source *s) {
    struct stat st;
    if (s->remote || s->virt) return true;
    return stat(s->path, &st) == 0 && st.st_dev == s->dev && st.st_ino == s->ino;
}

bool ckpt_source_mark_changed(const ckpt_source *s) {
    /* The catalog's sources are never const objects, only seen through const pointers. */
    return !__atomic_exchange_n(&((ckpt_source *)s)->seen_changed, true, __ATOMIC_ACQ_REL);
}

void ckpt_source_own_ctime_begin(ckpt_source *s) {
    /* owned sources never compare ctime; remote and cast ones have none */
    if (!s->remote && !s->virt && !s->owned && !(s->own_ctime_gen & 1))
        __atomic_fetch_add(&s->own_ctime_gen, 1, __ATOMIC_ACQ_REL);
}

void ckpt_source_own_ctime_end(ckpt_source *s) {
    if (s->remote || s->virt || !(__atomic_load_n(&s->own_ctime_gen, __ATOMIC_ACQUIRE) & 1)) return;
    struct stat st;
    bool got = s->fd >= 0 ? fstat(s->fd, &st) == 0 : stat(s->path, &st) == 0;
    if (got && ckpt_source_stat_matches(s, &st)) { /* ctime is not compared while odd */
        __atomic_store_n(&s->ctime.tv_sec, st.st_ctim.tv_sec, __ATOMIC_RELAXED);
        __atomic_store_n(&s->ctime.tv_nsec, st.st_ctim.tv_nsec, __ATOMIC_RELAXED);
        __atomic_store_n(&s->nlink, (uint64_t)st.st_nlink, __ATOMIC_RELAXED);
    } else {
        ckpt_source_mark_changed(s);
    }
    __atomic_fetch_add(&s->own_ctime_gen, 1, __ATOMIC_RELEASE);
}

ssize_t ckpt_source_pread(const ckpt_source *s, void *buf, size_t len, uint64_t off) {
    if (s->virt) return s->virt->pread(s->virt_ctx, buf, len, off);
    if (s->zst) return zst_pread(s->zst, buf, len, off);
    if (s->member_of) { /* never past the member's end into the next one */
        if (off >= s->size) return 0;
        if (len > s->size - off) len = (size_t)(s->size - off);
        off += s->base;
    }
    /* A member of a remote archive reads its archive's object at the member's offset. */
    if (s->remote) return remote_pread(s->remote, buf, len, off);
    int fd = s->fd >= 0 ? s->fd : ckpt_source_open_again(s);
    if (fd < 0) return fd;
    ssize_t r;
    while ((r = pread(fd, buf, len, (off_t)off)) < 0 && errno == EINTR) {
    }
    if (r < 0) r = -errno;
    if (fd != s->fd) close(fd);
    return r;
}

int ckpt_source_view(const ckpt_source *s, uint64_t off, size_t len, ckpt_view *v) {
    if (!s->remote || s->zst) return 0;
    if (s->member_of) {
        if (off > s->size || len > s->size - off) return 0;
        off += s->base;
    }
    return remote_view(s->remote, off, len, v);
}

void ckpt_view_release(ckpt_view *v) {
    for (size_t i = 0; i < v->n; i++) remote_unview(v->hold[i]);
    v->n = 0;
}

int ckpt_source_read(const ckpt_catalog *cat, uint32_t source, uint64_t off, void *buf, size_t len,
                     const char *what, ckpt_err *err) {
    const ckpt_source *s = &cat->sources[source];
    if (off > s->size || len > s->size - off)
        return ckpt_fail(err, -EINVAL,
                         "%s: %s at offset %llu (%zu bytes) runs past the end of "
                         "the file (size %llu)",
                         s->path, what, (unsigned long long)off, len, (unsigned long long)s->size);
    size_t got = 0;
    while (got < len) {
        ssize_t r = ckpt_source_pread(s, (char *)buf + got, len - got, off + got);
        if (r < 0)
            return ckpt_fail(err, (int)r, "%s: reading %s at offset %llu%s: %s", s->path, what,
                             (unsigned long long)(off + got),
                             s->zst ? " of the decompressed content" : "",
                             s->virt     ? s->virt->last_error()
                             : s->zst    ? zst_last_error()
                             : s->remote ? remote_last_error()
                                         : strerror((int)-r));
        if (r == 0)
            return ckpt_fail(err, -EIO, "%s: file shrank while reading %s at offset %llu", s->path,
                             what, (unsigned long long)(off + got));
        got += (size_t)r;
    }
    if (!ckpt_source_unchanged(s))
        return ckpt_fail(
            err, -EIO,
            "%s: changed since it was opened (size, modification or change time), while "
            "reading %s at offset %llu: its bytes no longer match its header",
            s->path, what, (unsigned long long)off);
    return 0;
}

bool ckpt_source_remote_changed(const ckpt_source *s) {
    return s->remote && remote_changed(s->remote);
}

bool ckpt_source_file_extent(const ckpt_source *s, uint64_t off, uint64_t len, uint64_t *file_off) {
    if (s->zst || s->remote || s->virt || off > s->size || len > s->size - off) return false;
    *file_off = s->base + off; /* base is 0 but for a tar member */
    return true;
}

bool ckpt_source_whole_file(const ckpt_source *s) {
    return !s->zst && !s->member_of && !s->remote && !s->virt;
}

bool ckpt_source_is_file(const ckpt_source *s, dev_t dev, ino_t ino) {
    return ckpt_source_whole_file(s) && s->dev == dev && s->ino == ino;
}

uint64_t ckpt_source_stored_size(const ckpt_source *s) {
    return s->zst ? zst_file_size(s->zst) : s->member_of ? s->file_size : s->size;
}
