#include "writer.h"
#include "segread.h"

#include "catalog.h"
#include "formats/formats.h"
#include "hashmap.h"
#include "hfview.h"
#include "utf8.h"
#include "zstd_seekable.h"

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
    FRAME_CUT = 256 << 10, /* a frame this full ends at the next tensor */
};

static int fsync_dir_of(const char *path) {
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
    f->buf_cap = compress ? ZST_FRAME_MAX : OUT_BUF;
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
    mode_t mask = umask(0);
    umask(mask);
    fchmod(f->fd, 0666 & ~mask);
    return 0;
}

/* An output never lets group or others do what its sources deny them: a 0600 shard converts to
 * 0600, whatever the umask allows. The owner's bits come from the umask alone, so the user can
 * still replace what they wrote. */
static mode_t umask_now(void) {
    mode_t mask = umask(0);
    umask(mask);
    return mask;
}

void out_limit_mode(out_file *f, mode_t sources) {
    if (f->fd >= 0) fchmod(f->fd, (0666 & ~umask_now()) & (0600 | (sources & 0066)));
}

/* The modes of the sources tensors and headers come from (config and tokenizer files, copied
 * as they are, keep their own). */
static mode_t data_sources_mode(const ckpt_catalog *cat) {
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
        ssize_t w = write(f->fd, (const char *)p + at, n - at);
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
        f->failed = -e;
        ckpt_fail(f->err, -e, "%s: reading its pieces from %s: %s", what,
                  cat->sources[seg[0].source].path,
                  e == EIO ? "a file is shorter than when it was opened, or changed" : strerror(e));
        return k;
    }
    f->buf_len += (size_t)total;
    f->written += total;
    if (f->buf_len == f->buf_cap) flush(f);
    return k;
}

static void out_segments(out_file *f, const ckpt_catalog *cat, const ckpt_segment *seg, size_t n,
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
                          r == 0   ? "the file is shorter than when it was opened"
                          : s->zst ? zst_last_error()
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
            ckpt_fail(f->err, -EIO, "%s: %s changed while it was read (size or modification time)",
                      what, s->path);
        }
    }
}

int tensor_read(const ckpt_catalog *cat, const ckpt_tensor *t, uint64_t off, void *buf, size_t len,
                ckpt_err *err) {
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
            } else {
                int rc =
                    source_read(cat, seg[i].source, seg[i].offset, dst, seg[i].length, what, err);
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

static void out_vfile(out_file *f, const ckpt_catalog *cat, const ckpt_vfile *vf) {
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
    if (!f->failed && rename(f->temp_path, f->final_path) != 0) {
        f->failed = -errno;
        ckpt_fail(f->err, f->failed, "%s: rename into place: %s", f->final_path, strerror(errno));
    }
    int rc = f->failed;
    if (!rc) {
        close(f->fd);
        f->fd = -1;
        rc = fsync_dir_of(f->final_path);
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

/* ---- safetensors: the HF view's files, written out ---- */

static int join(char *out, size_t cap, const char *dir, const char *name, ckpt_err *err) {
    int n = snprintf(out, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap)
        return ckpt_fail(err, -ENAMETOOLONG, "%s/%s: path too long", dir, name);
    return 0;
}

/* A converted checkpoint must hold every model tensor: refuse rather than drop any. */
static int check_safetensors_fit(const ckpt_catalog *cat, ckpt_err *err) {
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        if (t->aside) continue;
        size_t bad = utf8_invalid_at(t->name, t->name_len);
        if (bad < t->name_len) {
            char shown[256];
            return ckpt_fail(err, -EINVAL,
                             "tensor \"%s\": the name is not valid UTF-8 (byte 0x%02x at %zu), "
                             "which a safetensors header (JSON) cannot hold",
                             utf8_shown(shown, sizeof shown, t->name, t->name_len),
                             (unsigned char)t->name[bad], bad);
        }
        if (!ckpt_dtype_info_of(t->dtype)->safetensors)
            return ckpt_fail(err, -EINVAL, "tensor \"%.*s\" is %s, which safetensors cannot hold",
                             SHOWN_NAME(t->name, t->name_len), ckpt_dtype_info_of(t->dtype)->name);
        if (t->incomplete)
            return ckpt_fail(err, -EIO,
                             "tensor \"%.*s\" is incomplete (part of it is stored "
                             "nowhere)",
                             SHOWN_NAME(t->name, t->name_len));
    }
    return 0;
}

static uint64_t view_bytes(const ckpt_hfview *v) {
    uint64_t total = 0;
    for (size_t i = 0; i < v->nfiles; i++) total += v->files[i].vf.size;
    return total;
}

static int write_file(const char *path, bool compress, const ckpt_catalog *cat,
                      const ckpt_vfile *vf, const ckpt_write_opts *opts, uint64_t total,
                      uint64_t *done, ckpt_err *err) {
    out_file f;
    int rc = out_open(&f, path, compress, err);
    if (rc) return rc;
    out_limit_mode(&f, data_sources_mode(cat));
    f.progress = &opts->progress;
    f.progress_total = total;
    f.progress_done = done;
    out_vfile(&f, cat, vf);
    return out_commit(&f);
}

/* One file (compressed or not), or with `directory` an HF directory of plain files. */
static int write_safetensors(const ckpt_catalog *cat, const char *out, const ckpt_write_opts *opts,
                             bool directory, bool compress, ckpt_err *err) {
    int rc = check_safetensors_fit(cat, err);
    if (rc) return rc;
    ckpt_hfview view;
    uint64_t shard = opts->max_shard_size ? opts->max_shard_size : CKPT_HF_MAX_SHARD_DEFAULT;
    if ((rc = ckpt_hfview_build(cat, directory ? shard : 0, &view, err))) return rc;
    uint64_t total = view_bytes(&view), done = 0;
    if (!directory) {
        rc = write_file(out, compress, cat, &view.files[0].vf, opts, total, &done, err);
        ckpt_hfview_free(&view);
        return rc;
    }
    /* A directory appears whole or not at all: build it under a temporary name. */
    /* ".OUT.partial-XXXXXX" beside OUT, like the file temporaries: hidden and plainly unfinished */
    char tmp[PATH_MAX], *copy_dir = strdup(out), *copy_base = strdup(out);
    int w = copy_dir && copy_base ? snprintf(tmp, sizeof tmp, "%s/.%s.partial-XXXXXX",
                                             dirname(copy_dir), basename(copy_base))
                                  : -1;
    free(copy_dir);
    free(copy_base);
    if (w < 0 || w >= (int)sizeof tmp || !mkdtemp(tmp)) {
        ckpt_hfview_free(&view);
        return ckpt_fail(err, -errno, "%s: cannot create a temporary directory: %s", out,
                         strerror(errno));
    }
    for (size_t i = 0; !rc && i < view.nfiles; i++) {
        char path[PATH_MAX];
        rc = join(path, sizeof path, tmp, view.files[i].name, err);
        if (!rc) rc = write_file(path, false, cat, &view.files[i].vf, opts, total, &done, err);
    }
    /* config and tokenizer files travel with the weights */
    for (size_t i = 0; !rc && i < cat->naux; i++) {
        const ckpt_source *s = &cat->sources[cat->aux[i].source];
        char path[PATH_MAX];
        out_file f;
        if ((rc = join(path, sizeof path, tmp, cat->aux[i].name, err)) ||
            (rc = out_open(&f, path, false, err)))
            break;
        out_limit_mode(&f, s->mode);
        ckpt_segment seg = {
            .kind = CKPT_SEG_FILE, .source = cat->aux[i].source, .offset = 0, .length = s->size};
        out_segments(&f, cat, &seg, 1, s->path);
        rc = out_commit(&f);
    }
    /* mkdtemp makes 0700; the directory lists what every source holds */
    mode_t readable = cat->nsources ? data_sources_mode(cat) & 0044 : 0044;
    for (size_t i = 0; i < cat->naux; i++) readable &= cat->sources[cat->aux[i].source].mode;
    chmod(tmp, (0777 & ~umask_now()) & (0700 | readable | readable >> 2));
    int rename_errno = !rc && rename(tmp, out) != 0 ? errno : 0;
    bool exists = rename_errno == ENOTEMPTY || rename_errno == EEXIST;
    if (exists && opts->replace_dir)
        rc = writer_replace_dir(tmp, out, err); /* a stage committing OUT again */
    else if (rename_errno)
        rc = ckpt_fail(err, -rename_errno, "%s: cannot move the finished directory into place: %s",
                       out,
                       exists ? "it exists and is not empty (a directory is never merged into: "
                                "remove it or give a new name)"
                              : strerror(rename_errno));
    if (rc) {
        for (size_t i = 0; i < view.nfiles + cat->naux; i++) {
            char path[PATH_MAX];
            ckpt_err ignored;
            if (!join(path, sizeof path, tmp,
                      i < view.nfiles ? view.files[i].name : cat->aux[i - view.nfiles].name,
                      &ignored))
                unlink(path);
        }
        rmdir(tmp);
    } else {
        rc = fsync_dir_of(out);
    }
    ckpt_hfview_free(&view);
    return rc;
}

static bool has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

int ckpt_write(const ckpt_catalog *cat, const char *out, const ckpt_write_opts *opts,
               ckpt_err *err) {
    ckpt_write_opts none = {0};
    if (!opts) opts = &none;
    struct stat st;
    bool is_dir = (stat(out, &st) == 0 && S_ISDIR(st.st_mode)) || has_suffix(out, "/");
    /* NAME.EXT.zst: the writer of EXT, compressed. */
    char inner[PATH_MAX];
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/') n--;
    if (n >= sizeof inner) return ckpt_fail(err, -ENAMETOOLONG, "%s: path too long", out);
    memcpy(inner, out, n);
    inner[n] = '\0';
    bool compress = has_suffix(inner, ".zst");
    if (compress && (is_dir || opts->max_shard_size))
        return ckpt_fail(err, -EINVAL,
                         "%s: a Hugging Face directory cannot be written as .zst (only single "
                         "files: NAME.safetensors.zst, NAME.gguf.zst, ...)",
                         out);
    if (compress) inner[n - 4] = '\0';
    const char *name = compress ? inner : out;
    if (has_suffix(name, ".safetensors") && !opts->max_shard_size)
        return write_safetensors(cat, out, opts, false, compress, err);
    if (is_dir || opts->max_shard_size) /* inner: OUT without its trailing '/' */
        return write_safetensors(cat, inner, opts, true, false, err);
    int (*writer)(out_file *, const ckpt_catalog *, ckpt_err *) = NULL;
    if (has_suffix(name, ".gguf"))
        writer = write_gguf;
    else if (has_suffix(name, ".bpk"))
        writer = write_burnpack;
    else if (has_suffix(name, ".lwt"))
        writer = write_lwt;
    bool gptrs = has_suffix(name, ".gptrs"), gptrsten = has_suffix(name, ".gptrsten");
    if (!writer && !gptrs && !gptrsten)
        return ckpt_fail(err, -EINVAL,
                         "%s: cannot tell the output format from the name (use .safetensors, "
                         ".gguf, .bpk, .lwt, .gptrs, .gptrsten, any of them followed by .zst, or "
                         "a directory for HF shards)",
                         out);
    out_file f;
    int rc = out_open(&f, out, compress, err);
    if (rc) return rc;
    out_limit_mode(&f, data_sources_mode(cat));
    uint64_t done = 0;
    f.progress = &opts->progress;
    f.progress_done = &done;
    for (size_t i = 0; i < cat->ntensors; i++)
        if (!cat->tensors[i].aside) f.progress_total += cat->tensors[i].nbytes;
    rc = writer ? writer(&f, cat, err) : write_gptrs(&f, cat, gptrsten, err);
    if (rc) {
        out_abort(&f);
        return rc;
    }
    return out_commit(&f);
}
