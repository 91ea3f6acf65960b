#include "../ckpt.h"
#include "../util/err.h"
#include "remote/remote.h"
#include "zstd_seekable.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

int source_read(const ckpt_catalog *cat, uint32_t source, uint64_t off, void *buf, size_t len,
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

uint64_t ckpt_source_stored_size(const ckpt_source *s) {
    return s->zst ? zst_file_size(s->zst) : s->member_of ? s->file_size : s->size;
}
