/* What the pack's commits share (one safetensors OUT: stage_pack.c, an HF directory:
 * stage_pack_dir.c, a clone of the source: stage_pack_clone.c): tensor bytes appended, the
 * file put in place as OUT. Headers, the index and a directory OUT are the writer's
 * (core/write/packed.h). */
#include "stage_pack.h"

#include "core/util/pwrite_pieces.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int placed_cmp(const void *a, const void *b) {
    uint64_t x = ((const placed *)a)->off, y = ((const placed *)b)->off;
    return (x > y) - (x < y);
}

int pack_width_cmp(const void *a, const void *b, void *ctx) {
    const ckpt_catalog *cat = ctx;
    const ckpt_tensor *x = &cat->tensors[*(const size_t *)a],
                      *y = &cat->tensors[*(const size_t *)b];
    unsigned wx = ckpt_dtype_elem_size(x->dtype), wy = ckpt_dtype_elem_size(y->dtype);
    return (wx < wy) - (wx > wy);
}

uint64_t pack_live_end(const snode *dir, uint64_t id) {
    uint64_t end = 0;
    for (size_t b = 0; b < dir->nbuckets; b++)
        for (const snode *c = dir->buckets[b]; c; c = c->hash_next) {
            uint64_t e = c->kind == SN_DIR                        ? pack_live_end(c, id)
                         : c->src == SRC_PACK && c->data_id == id ? c->pack_off + c->pack_size
                                                                  : 0;
            if (e > end) end = e;
        }
    return end;
}

int pack_pwrite_all(int fd, const void *p, size_t n, uint64_t at) {
    return pwrite_pieces(fd, p, n, at);
}

enum { COPY_CHUNK = 64 << 20, BUF = PACK_COPY_BUF };

/* Bytes [off, off+len) of source s, at `at` of the pack. */
static int copy_segment(const ckpt_source *s, uint64_t off, uint64_t len, int out, uint64_t at,
                        char *buf) {
    int in = s->zst ? -1 : s->fd >= 0 ? s->fd : ckpt_source_open_again(s);
    uint64_t done = 0;
    while (in >= 0 && done < len) {
        loff_t src_at = (loff_t)(s->base + off + done), dst_at = (loff_t)(at + done);
        size_t want = len - done < COPY_CHUNK ? (size_t)(len - done) : COPY_CHUNK;
        ssize_t r = copy_file_range(in, &src_at, out, &dst_at, want, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break; /* not here: the rest through the buffer */
        done += (uint64_t)r;
    }
    if (in >= 0 && in != s->fd) close(in);
    while (done < len) {
        size_t want = len - done < BUF ? (size_t)(len - done) : BUF;
        ssize_t r = ckpt_source_pread(s, buf, want, off + done);
        if (r <= 0) return r < 0 ? (int)r : -EIO;
        int e = pack_pwrite_all(out, buf, (size_t)r, at + done);
        if (e) return e;
        done += (uint64_t)r;
    }
    /* After the copy, as every reader does: what was copied is the source's own bytes only if
     * the file is still the one the catalog saw (a write moves mtime and ctime first). */
    return ckpt_source_unchanged(s) ? 0 : -EIO;
}

int pack_append_tensor(stage *st, const ckpt_catalog *cat, const ckpt_tensor *t, int out,
                       uint64_t at, char *buf) {
    uint64_t off = 0;
    while (off < t->nbytes) {
        ckpt_segment seg[64];
        uint64_t done;
        size_t n = ckpt_plan(t, off, t->nbytes - off, seg, 64, &done);
        if (n == 0) return -EIO;
        uint64_t pos = at + off;
        for (size_t i = 0; i < n; i++) {
            int e = seg[i].kind == CKPT_SEG_MEM
                        ? pack_pwrite_all(out, seg[i].mem, seg[i].length, pos)
                    : seg[i].kind == CKPT_SEG_FILE
                        ? copy_segment(&cat->sources[seg[i].source], seg[i].offset, seg[i].length,
                                       out, pos, buf)
                        : -EIO;
            if (e) return e;
            pos += seg[i].length;
        }
        off += done;
        atomic_fetch_add(&st->progress_done, done);
    }
    return 0;
}

int pack_fsync_parent(const char *path) {
    char copy[PATH_MAX];
    snprintf(copy, sizeof copy, "%s", path);
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -errno;
    int rc = fsync(fd) == 0 ? 0 : -errno;
    close(fd);
    return rc;
}

int note_landing(stage *st, int fd, const char *path) {
    if (!stage_replaces_source(st)) return 0;
    struct stat s;
    if (fd >= 0 ? fstat(fd, &s) != 0 : stat(path, &s) != 0) return -errno;
    pthread_mutex_lock(&st->lock);
    int rc = spool_note_landing(st, &s);
    pthread_mutex_unlock(&st->lock);
    return rc;
}

int pack_publish(stage *st, int fd, uint64_t id, ckpt_err *err) {
    char tmp[PATH_MAX], dir[PATH_MAX], base[PATH_MAX], pack[64];
    snprintf(dir, sizeof dir, "%s", st->out);
    snprintf(base, sizeof base, "%s", st->out);
    snprintf(pack, sizeof pack, "/proc/self/fd/%d", fd);
    int rc = note_landing(st, fd, NULL);
    if (rc)
        return ckpt_fail(err, rc, "%s: the spool cannot record the commit: %s", st->out,
                         strerror(-rc));
    for (int attempt = 0;; attempt++) {
        snprintf(tmp, sizeof tmp, "%s/.%s.partial-%llx-%d", dirname(dir), basename(base),
                 (unsigned long long)id, attempt);
        snprintf(dir, sizeof dir, "%s", st->out); /* dirname may have changed it */
        if (linkat(AT_FDCWD, pack, AT_FDCWD, tmp, AT_SYMLINK_FOLLOW) == 0) break;
        if (errno != EEXIST || attempt == 16)
            return ckpt_fail(err, -errno, "%s: cannot link the staged file beside it: %s", st->out,
                             strerror(errno));
    }
    if (rename(tmp, st->out) != 0) {
        int e = errno;
        unlink(tmp);
        return ckpt_fail(err, -e, "%s: rename into place: %s", st->out, strerror(e));
    }
    rc = pack_fsync_parent(st->out);
    if (rc) return ckpt_fail(err, rc, "%s: fsync of its directory failed", st->out);
    return 0;
}
