/* The output-file helpers every writer in this folder writes through. */
#include "writers.h"

#include "../writer.h"

#include "../../model/catalog.h"
#include "../../util/hashmap.h"
#include "../../util/le.h"
#include "../../read/segread.h"
#include "../../io/zstd_seekable.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum {
    OUT_BUF = 4 << 20,
    FRAME_CUT = ZST_FRAME_TARGET / 4, /* a frame this full ends at the next tensor */
};

int out_fsync_dir_of(const char *path) {
    char *copy = strdup(path);
    if (!copy) return -ENOMEM;
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(copy);
    if (fd < 0) return -errno;
    int rc = fsync(fd) == 0 ? 0 : -errno;
    close(fd);
    return rc;
}

int out_open(out_file *f, const char *path, bool compress, ckpt_err *err) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->err = err;
    size_t n = strlen(path);
    f->final_path = strdup(path);
    f->temp_path = malloc(n + 32);
    f->buf_cap = compress ? ZST_FRAME_TARGET : OUT_BUF;
    f->buf = malloc(f->buf_cap);
    if (compress) f->zst = zst_writer_new();
    if (!f->final_path || !f->temp_path || !f->buf || (compress && !f->zst)) {
        out_abort(f);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    /* Same directory as OUT, so the final rename cannot cross file systems. The name says
     * what it is: an unfinished file is never mistaken for a finished one. */
    char *dir = strdup(path), *base = strdup(path);
    if (!dir || !base) {
        free(dir);
        free(base);
        out_abort(f);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    snprintf(f->temp_path, n + 32, "%s/.%s.partial-XXXXXX", dirname(dir), basename(base));
    free(dir);
    free(base);
    f->fd = mkstemp(f->temp_path);
    if (f->fd < 0) {
        int e = errno;
        out_abort(f);
        return ckpt_fail(err, -e, "%s: cannot create a temporary file next to it: %s", path,
                         strerror(e));
    }
    /* mkstemp makes 0600; the result should have the usual mode, from the umask. */
    fchmod(f->fd, 0666 & ~ckpt_umask());
    return 0;
}

/* An output never lets group or others do what its sources deny them: a 0600 shard converts to
 * 0600, whatever the umask allows. The owner's bits come from the umask alone, so the user can
 * still replace what they wrote. */
mode_t ckpt_umask(void) {
    /* umask() can only be read by setting it, and the process's other threads (a staging
     * mount's workers creating files) would see the interim 0 and create world-writable files.
     * Linux (4.7+) shows it in /proc/self/status; the set-and-restore is the fallback. */
    mode_t mask = 0;
    FILE *f = fopen("/proc/self/status", "re");
    if (f) {
        char line[128];
        bool found = false;
        while (!found && fgets(line, sizeof line, f)) {
            unsigned int v;
            if (sscanf(line, "Umask: %o", &v) == 1) {
                mask = (mode_t)(v & 0777);
                found = true;
            }
        }
        fclose(f);
        if (found) return mask;
    }
    mask = umask(0);
    umask(mask);
    return mask;
}

void out_limit_mode(out_file *f, mode_t sources) {
    if (f->fd >= 0) fchmod(f->fd, (0666 & ~ckpt_umask()) & (0600 | (sources & 0066)));
}

mode_t out_data_sources_mode(const ckpt_catalog *cat) {
    mode_t m = 07777;
    for (uint32_t i = 0; i < cat->nsources; i++) {
        bool aux = false;
        for (size_t k = 0; !aux && k < cat->naux; k++) aux = cat->aux[k].source == i;
        if (!aux) m &= cat->sources[i].mode;
    }
    return m;
}

static void write_all(out_file *f, const void *p, size_t n) {
    size_t at = 0;
    while (!f->failed && at < n) {
        size_t want = n - at < PWRITE_PIECE ? n - at : PWRITE_PIECE;
        ssize_t w = write(f->fd, (const char *)p + at, want);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : ENOSPC;
            f->failed = -e;
            ckpt_fail(f->err, -e, "%s: writing at offset %llu: %s", f->final_path,
                      (unsigned long long)(f->file_at + at), strerror(e));
            break;
        }
        at += (size_t)w;
    }
    f->file_at += at;
}

/* Writes the buffer out: as it is, or as one zstd frame. */
static void flush(out_file *f) {
    size_t n = f->buf_len;
    f->buf_len = 0;
    if (f->failed || n == 0) return;
    if (f->zst) {
        const void *frame;
        size_t len;
        const char *why;
        int rc = zst_writer_frame(f->zst, f->buf, n, &frame, &len, &why);
        if (rc) {
            f->failed = rc;
            ckpt_fail(f->err, rc, "%s: compressing bytes %llu..%llu: %s", f->final_path,
                      (unsigned long long)(f->written - n), (unsigned long long)(f->written - 1),
                      why);
            return;
        }
        write_all(f, frame, len);
    } else {
        write_all(f, f->buf, n);
    }
    if (!f->failed && f->progress && f->progress->report && f->progress_done) {
        *f->progress_done += n;
        f->progress->report(f->progress->ctx, *f->progress_done, f->progress_total);
    }
}

bool out_compressed(const out_file *f) {
    return f->zst != NULL;
}

/* Between tensors: a frame that holds enough already ends here rather than in the middle of
 * the next tensor. */
static void out_boundary(out_file *f) {
    if (f->zst && f->buf_len >= FRAME_CUT) flush(f);
}

void out_bytes(out_file *f, const void *p, size_t n) {
    const unsigned char *src = p;
    while (!f->failed && n) {
        size_t take = f->buf_cap - f->buf_len < n ? f->buf_cap - f->buf_len : n;
        memcpy(f->buf + f->buf_len, src, take);
        f->buf_len += take;
        f->written += take;
        src += take;
        n -= take;
        if (f->buf_len == f->buf_cap) flush(f);
    }
}

void out_le32(out_file *f, uint32_t v) {
    unsigned char b[4];
    put_le32(b, v);
    out_bytes(f, b, 4);
}

void out_le64(out_file *f, uint64_t v) {
    unsigned char b[8];
    put_le64(b, v);
    out_bytes(f, b, 8);
}

void out_zeros(out_file *f, size_t n) {
    static const unsigned char zeros[4096];
    while (n) {
        size_t take = n < sizeof zeros ? n : sizeof zeros;
        out_bytes(f, zeros, take);
        n -= take;
    }
}

/* A long run of a plain source file into a plain OUT: the kernel copies it page cache to page
 * cache (copy_file_range), without the round trip through our buffer, and each finished chunk
 * is handed to writeback at once so the final fsync has little left and OUT's dirty pages never
 * push the system's other dirty data (a stage's spool) to disk in the middle of a commit.
 * Returns false, having copied nothing, where the kernel cannot do it (then the caller copies
 * through the buffer); true once copied or once f->failed is set. */
enum { COPY_RANGE_MIN = 1 << 20, COPY_RANGE_CHUNK = 64 << 20 };

static bool copy_range(out_file *f, const ckpt_source *s, uint64_t off, uint64_t len,
                       const char *what) {
    if (s->fd < 0) return false; /* a remote source: through the buffer */
    flush(f);
    if (f->failed) return true;
    int in_fd = s->fd >= 0 ? s->fd : ckpt_source_open_again(s);
    if (in_fd < 0) return false; /* the read path says why */
    uint64_t done = 0;
    while (done < len) {
        loff_t in = (loff_t)(s->base + off + done); /* base: a tar member's start */
        size_t want = len - done < COPY_RANGE_CHUNK ? (size_t)(len - done) : COPY_RANGE_CHUNK;
        ssize_t r = copy_file_range(in_fd, &in, f->fd, NULL, want, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && done == 0 &&
            (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)) {
            if (in_fd != s->fd) close(in_fd);
            return false;
        }
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            f->failed = -e;
            ckpt_fail(f->err, -e, "%s: copying %s at offset %llu into %s: %s", what, s->path,
                      (unsigned long long)(off + done), f->final_path,
                      r == 0 ? "the file is shorter than when it was opened" : strerror(e));
            break;
        }
        if (!ckpt_source_unchanged(s)) {
            f->failed = -EIO;
            ckpt_fail(f->err, -EIO, "%s: %s changed while it was copied into %s", what, s->path,
                      f->final_path);
            return true;
        }
        sync_file_range(f->fd, (off_t)f->file_at, r, SYNC_FILE_RANGE_WRITE);
        done += (uint64_t)r;
        f->written += (uint64_t)r;
        f->file_at += (uint64_t)r;
        if (f->progress && f->progress->report && f->progress_done) {
            *f->progress_done += (uint64_t)r;
            f->progress->report(f->progress->ctx, *f->progress_done, f->progress_total);
        }
    }
    if (in_fd != s->fd) close(in_fd);
    return true;
}

enum { SMALL_SEGMENT = 64 * 1024 };

/* A run of short file segments from seg (row fragments of a consolidated tensor) read into the
 * buffer at once; how many were taken, 0 when reading them one by one is as good. */
static size_t out_fragments(out_file *f, const ckpt_catalog *cat, const ckpt_segment *seg, size_t n,
                            const char *what) {
    if (f->buf_cap - f->buf_len < SMALL_SEGMENT) flush(f);
    size_t room = f->buf_cap - f->buf_len, k = 0;
    uint64_t total = 0;
    while (k < n && seg[k].kind == CKPT_SEG_FILE && seg[k].length < SMALL_SEGMENT &&
           total + seg[k].length <= room)
        total += seg[k++].length;
    if (k < 4 || f->failed) return 0;
    if (!f->gather && !(f->gather = malloc(SEGREAD_SCRATCH))) return 0;
    int e = ckpt_read_segments(cat, seg, k, (char *)f->buf + f->buf_len, f->gather);
    if (e) {
        f->failed = e;
        ckpt_fail(
            f->err, e, "%s: reading its pieces from %s: %s", what, cat->sources[seg[0].source].path,
            e == -EIO ? "a file is shorter than when it was opened, or changed" : strerror(-e));
        return k;
    }
    f->buf_len += (size_t)total;
    f->written += total;
    if (f->buf_len == f->buf_cap) flush(f);
    return k;
}

/* A strided piece's bytes, a buffer's room at a time (core/read/strided.c copies them in blocks). */
static void out_strided(out_file *f, const ckpt_catalog *cat, const ckpt_segment *seg,
                        const char *what) {
    if (!f->gather && !(f->gather = malloc(SEGREAD_SCRATCH))) {
        f->failed = -ENOMEM;
        ckpt_fail(f->err, -ENOMEM, "%s: out of memory", what);
        return;
    }
    for (uint64_t done = 0; done < seg->length && !f->failed;) {
        if (f->buf_len == f->buf_cap) flush(f);
        if (f->failed) return;
        size_t room = f->buf_cap - f->buf_len;
        ckpt_segment part = *seg;
        part.offset += done;
        part.length = seg->length - done < room ? seg->length - done : room;
        int e = ckpt_read_segments(cat, &part, 1, (char *)f->buf + f->buf_len, f->gather);
        if (e) {
            f->failed = e;
            ckpt_fail(f->err, e, "%s: reading its strided piece from %s: %s", what,
                      cat->sources[seg->source].path,
                      e == -EIO ? "the file changed or is shorter than when it was opened"
                                : strerror(-e));
            return;
        }
        f->buf_len += (size_t)part.length;
        f->written += part.length;
        done += part.length;
    }
    if (f->buf_len == f->buf_cap) flush(f);
}

void out_segments(out_file *f, const ckpt_catalog *cat, const ckpt_segment *seg, size_t n,
                  const char *what) {
    for (size_t i = 0; i < n && !f->failed; i++) {
        if (n - i >= 4 && seg[i].kind == CKPT_SEG_FILE && seg[i].length < SMALL_SEGMENT) {
            size_t k = out_fragments(f, cat, seg + i, n - i, what);
            if (k) {
                i += k - 1;
                continue;
            }
        }
        if (seg[i].kind == CKPT_SEG_MEM) {
            out_bytes(f, seg[i].mem, seg[i].length);
            continue;
        }
        if (seg[i].kind == CKPT_SEG_HOLE) {
            f->failed = -EIO;
            ckpt_fail(f->err, -EIO, "%s: part of it is stored nowhere (incomplete)", what);
            return;
        }
        if (seg[i].kind == CKPT_SEG_STRIDED) {
            out_strided(f, cat, &seg[i], what);
            continue;
        }
        const ckpt_source *s = &cat->sources[seg[i].source];
        if (!f->zst && !s->zst && seg[i].length >= COPY_RANGE_MIN &&
            copy_range(f, s, seg[i].offset, seg[i].length, what))
            continue;
        uint64_t done = 0;
        while (done < seg[i].length && !f->failed) {
            size_t room = f->buf_cap - f->buf_len;
            size_t take = seg[i].length - done < room ? (size_t)(seg[i].length - done) : room;
            ssize_t r = ckpt_source_pread(s, f->buf + f->buf_len, take, seg[i].offset + done);
            if (r <= 0) {
                int e = r < 0 ? (int)-r : EIO;
                f->failed = -e;
                ckpt_fail(f->err, -e, "%s: reading %s at offset %llu: %s", what, s->path,
                          (unsigned long long)(seg[i].offset + done),
                          r == 0    ? "the file is shorter than when it was opened"
                          : s->virt ? s->virt->last_error()
                          : s->zst  ? zst_last_error()
                                    : strerror(e));
                return;
            }
            f->buf_len += (size_t)r;
            f->written += (uint64_t)r;
            done += (uint64_t)r;
            if (f->buf_len == f->buf_cap) flush(f);
        }
        if (!f->failed && !ckpt_source_unchanged(s)) {
            f->failed = -EIO;
            ckpt_fail(f->err, -EIO,
                      "%s: %s changed while it was read (size, modification or change time)", what,
                      s->path);
        }
    }
}

int out_tensor_read(const ckpt_catalog *cat, const ckpt_tensor *t, uint64_t off, void *buf,
                    size_t len, ckpt_err *err) {
    char what[160];
    snprintf(what, sizeof what, "tensor \"%.*s\"", SHOWN_NAME(t->name, t->name_len));
    size_t got = 0;
    while (got < len) {
        ckpt_segment seg[64];
        uint64_t done;
        size_t n = ckpt_plan(t, off + got, len - got, seg, 64, &done);
        if (n == 0)
            return ckpt_fail(err, -EIO, "%s: no bytes at offset %llu", what,
                             (unsigned long long)(off + got));
        for (size_t i = 0; i < n; i++) {
            char *dst = (char *)buf + got;
            if (seg[i].kind == CKPT_SEG_HOLE)
                return ckpt_fail(err, -EIO, "%s: part of it is stored nowhere (incomplete)", what);
            if (seg[i].kind == CKPT_SEG_MEM) {
                memcpy(dst, seg[i].mem, seg[i].length);
            } else if (seg[i].kind == CKPT_SEG_STRIDED) {
                int e = ckpt_read_segments(cat, &seg[i], 1, dst, NULL);
                if (e)
                    return ckpt_fail(err, e, "%s: reading its strided piece from %s: %s", what,
                                     cat->sources[seg[i].source].path, strerror(-e));
            } else {
                int rc = ckpt_source_read(cat, seg[i].source, seg[i].offset, dst, seg[i].length,
                                          what, err);
                if (rc) return rc;
            }
            got += seg[i].length;
        }
    }
    return 0;
}

void out_tensor(out_file *f, const ckpt_catalog *cat, const ckpt_tensor *t) {
    char what[160];
    snprintf(what, sizeof what, "tensor \"%.*s\"", SHOWN_NAME(t->name, t->name_len));
    out_boundary(f);
    uint64_t off = 0;
    while (off < t->nbytes && !f->failed) {
        ckpt_segment seg[256];
        uint64_t done;
        size_t n = ckpt_plan(t, off, t->nbytes - off, seg, 256, &done);
        if (n == 0) break;
        out_segments(f, cat, seg, n, what);
        off += done;
    }
}

void out_vfile(out_file *f, const ckpt_catalog *cat, const ckpt_vfile *vf) {
    for (size_t p = 0; p < vf->nparts && !f->failed; p++) {
        uint64_t off = vf->parts[p].start, end = off + vf->parts[p].length;
        out_boundary(f);
        while (off < end && !f->failed) {
            ckpt_segment seg[64];
            uint64_t done;
            size_t n = ckpt_vfile_plan(vf, off, end - off, seg, 64, &done);
            if (n == 0) break;
            out_segments(f, cat, seg, n, f->final_path);
            off += done;
        }
    }
}

void out_abort(out_file *f) {
    if (f->fd >= 0) {
        close(f->fd);
        unlink(f->temp_path);
    }
    free(f->final_path);
    free(f->temp_path);
    free(f->buf);
    free(f->gather);
    f->gather = NULL;
    zst_writer_free(f->zst);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

/* The seek table closes a compressed file: what readers look for at its end. */
static void write_seek_table(out_file *f) {
    const void *table;
    size_t len;
    const char *why;
    int rc = zst_writer_table(f->zst, &table, &len, &why);
    if (rc) {
        f->failed = rc;
        ckpt_fail(f->err, rc, "%s: writing the seek table: %s", f->final_path, why);
        return;
    }
    write_all(f, table, len);
}

int out_commit(out_file *f) {
    if (!f->failed) flush(f);
    if (!f->failed && f->zst) write_seek_table(f);
    if (!f->failed && fsync(f->fd) != 0) {
        f->failed = -errno;
        ckpt_fail(f->err, f->failed, "%s: fsync: %s", f->final_path, strerror(errno));
    }
    if (!f->failed && f->publish && f->publish->before_publish) {
        int rc = f->publish->before_publish(f->publish->publish_ctx, f->temp_path);
        if (rc < 0) {
            f->failed = rc;
            ckpt_fail(f->err, rc, "%s: not put in place: %s", f->final_path, strerror(-rc));
        }
    }
    if (!f->failed && rename(f->temp_path, f->final_path) != 0) {
        f->failed = -errno;
        ckpt_fail(f->err, f->failed, "%s: rename into place: %s", f->final_path, strerror(errno));
    }
    int rc = f->failed;
    if (!rc) {
        close(f->fd);
        f->fd = -1;
        rc = out_fsync_dir_of(f->final_path);
        if (rc) ckpt_fail(f->err, rc, "%s: fsync of its directory failed", f->final_path);
    }
    out_abort(f);
    return rc;
}

int writer_select(const out_file *f, const ckpt_catalog *cat,
                  int (*check)(const out_file *, const ckpt_tensor *, ckpt_err *),
                  const char *container, size_t **out, size_t *count, ckpt_err *err) {
    size_t *sel = malloc((cat->ntensors ? cat->ntensors : 1) * sizeof *sel);
    hashmap names;
    if (!sel || !hm_init(&names, cat->ntensors)) {
        free(sel);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    size_t n = 0;
    int rc = 0;
    for (size_t i = 0; i < cat->ntensors && !rc; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        if (t->aside) continue;
        if ((rc = check(f, t, err))) break;
        bool added;
        if (!hm_put(&names, t->name, t->name_len, i, &added))
            rc = ckpt_fail(err, -ENOMEM, "out of memory");
        else if (!added)
            rc = ckpt_fail(err, -EINVAL,
                           "%s: tensor \"%.*s\": two tensors of the model have this name (under "
                           "different directories); %s holds one",
                           f->final_path, SHOWN_NAME(t->name, t->name_len), container);
        else
            sel[n++] = i;
    }
    hm_free(&names);
    if (rc) {
        free(sel);
        return rc;
    }
    *out = sel;
    *count = n;
    return 0;
}
