#include "writer.h"

#include "catalog.h"
#include "hashmap.h"
#include "hfview.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { OUT_BUF = 4 << 20 };

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

int out_open(out_file *f, const char *path, ckpt_err *err) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->err = err;
    size_t n = strlen(path);
    f->final_path = strdup(path);
    f->temp_path = malloc(n + 32);
    f->buf = malloc(OUT_BUF);
    if (!f->final_path || !f->temp_path || !f->buf) {
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

static void flush(out_file *f) {
    size_t at = 0;
    while (!f->failed && at < f->buf_len) {
        ssize_t w = write(f->fd, f->buf + at, f->buf_len - at);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : ENOSPC;
            f->failed = -e;
            ckpt_fail(f->err, -e, "%s: writing at offset %llu: %s", f->final_path,
                      (unsigned long long)(f->written - f->buf_len + at), strerror(e));
            break;
        }
        at += (size_t)w;
    }
    f->buf_len = 0;
}

void out_bytes(out_file *f, const void *p, size_t n) {
    const unsigned char *src = p;
    while (!f->failed && n) {
        size_t take = OUT_BUF - f->buf_len < n ? OUT_BUF - f->buf_len : n;
        memcpy(f->buf + f->buf_len, src, take);
        f->buf_len += take;
        f->written += take;
        src += take;
        n -= take;
        if (f->buf_len == OUT_BUF) {
            flush(f);
            if (f->progress && f->progress->report && f->progress_done) {
                *f->progress_done += OUT_BUF;
                f->progress->report(f->progress->ctx, *f->progress_done, f->progress_total);
            }
        }
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

static void out_segments(out_file *f, const ckpt_catalog *cat, const ckpt_segment *seg, size_t n,
                         const char *what) {
    for (size_t i = 0; i < n && !f->failed; i++) {
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
        uint64_t done = 0;
        while (done < seg[i].length && !f->failed) {
            if (f->buf_len == OUT_BUF) flush(f);
            size_t room = OUT_BUF - f->buf_len;
            size_t take = seg[i].length - done < room ? (size_t)(seg[i].length - done) : room;
            ssize_t r = pread(s->fd, f->buf + f->buf_len, take, (off_t)(seg[i].offset + done));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                int e = r < 0 ? errno : EIO;
                f->failed = -e;
                ckpt_fail(f->err, -e, "%s: reading %s at offset %llu: %s", what, s->path,
                          (unsigned long long)(seg[i].offset + done),
                          r < 0 ? strerror(e) : "the file is shorter than when it was opened");
                return;
            }
            f->buf_len += (size_t)r;
            f->written += (uint64_t)r;
            done += (uint64_t)r;
            if (f->buf_len == OUT_BUF) {
                flush(f);
                if (f->progress && f->progress->report && f->progress_done) {
                    *f->progress_done += OUT_BUF;
                    f->progress->report(f->progress->ctx, *f->progress_done, f->progress_total);
                }
            }
        }
    }
}

void out_tensor(out_file *f, const ckpt_catalog *cat, const ckpt_tensor *t) {
    char what[160];
    snprintf(what, sizeof what, "tensor \"%.*s\"", SHOWN(t->name_len), t->name);
    uint64_t off = 0;
    while (off < t->nbytes && !f->failed) {
        ckpt_segment seg[64];
        uint64_t done;
        size_t n = ckpt_plan(t, off, t->nbytes - off, seg, 64, &done);
        if (n == 0) break;
        out_segments(f, cat, seg, n, what);
        off += done;
    }
}

static void out_vfile(out_file *f, const ckpt_catalog *cat, const ckpt_vfile *vf) {
    uint64_t off = 0;
    while (off < vf->size && !f->failed) {
        ckpt_segment seg[64];
        uint64_t done;
        size_t n = ckpt_vfile_plan(vf, off, vf->size - off, seg, 64, &done);
        if (n == 0) break;
        out_segments(f, cat, seg, n, f->final_path);
        off += done;
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
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

int out_commit(out_file *f) {
    if (!f->failed) flush(f);
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
                           f->final_path, SHOWN(t->name_len), t->name, container);
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
        if (!ckpt_dtype_info_of(t->dtype)->safetensors)
            return ckpt_fail(err, -EINVAL, "tensor \"%.*s\" is %s, which safetensors cannot hold",
                             SHOWN(t->name_len), t->name, ckpt_dtype_info_of(t->dtype)->name);
        if (t->incomplete)
            return ckpt_fail(err, -EIO,
                             "tensor \"%.*s\" is incomplete (part of it is stored "
                             "nowhere)",
                             SHOWN(t->name_len), t->name);
    }
    return 0;
}

static uint64_t view_bytes(const ckpt_hfview *v) {
    uint64_t total = 0;
    for (size_t i = 0; i < v->nfiles; i++) total += v->files[i].vf.size;
    return total;
}

static int write_file(const char *path, const ckpt_catalog *cat, const ckpt_vfile *vf,
                      const ckpt_write_opts *opts, uint64_t total, uint64_t *done, ckpt_err *err) {
    out_file f;
    int rc = out_open(&f, path, err);
    if (rc) return rc;
    f.progress = &opts->progress;
    f.progress_total = total;
    f.progress_done = done;
    out_vfile(&f, cat, vf);
    return out_commit(&f);
}

static int write_safetensors(const ckpt_catalog *cat, const char *out, const ckpt_write_opts *opts,
                             bool directory, ckpt_err *err) {
    int rc = check_safetensors_fit(cat, err);
    if (rc) return rc;
    ckpt_hfview view;
    if ((rc = ckpt_hfview_build(cat, directory ? opts->max_shard_size : 0, &view, err))) return rc;
    uint64_t total = view_bytes(&view), done = 0;
    if (!directory) {
        rc = write_file(out, cat, &view.files[0].vf, opts, total, &done, err);
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
        if (!rc) rc = write_file(path, cat, &view.files[i].vf, opts, total, &done, err);
    }
    /* config and tokenizer files travel with the weights */
    for (size_t i = 0; !rc && i < cat->naux; i++) {
        const ckpt_source *s = &cat->sources[cat->aux[i].source];
        char path[PATH_MAX];
        out_file f;
        if ((rc = join(path, sizeof path, tmp, cat->aux[i].name, err)) ||
            (rc = out_open(&f, path, err)))
            break;
        ckpt_segment seg = {
            .kind = CKPT_SEG_FILE, .source = cat->aux[i].source, .offset = 0, .length = s->size};
        out_segments(&f, cat, &seg, 1, s->path);
        rc = out_commit(&f);
    }
    mode_t mask = umask(0);
    umask(mask);
    chmod(tmp, 0777 & ~mask); /* mkdtemp makes 0700 */
    if (!rc && rename(tmp, out) != 0)
        rc = ckpt_fail(err, -errno, "%s: cannot move the finished directory into place: %s", out,
                       errno == ENOTEMPTY || errno == EEXIST ? "it exists and is not empty"
                                                             : strerror(errno));
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
    if (has_suffix(out, ".safetensors") && !opts->max_shard_size)
        return write_safetensors(cat, out, opts, false, err);
    if (is_dir || opts->max_shard_size) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s", out);
        size_t n = strlen(path);
        while (n > 1 && path[n - 1] == '/') path[--n] = '\0';
        return write_safetensors(cat, path, opts, true, err);
    }
    int (*writer)(out_file *, const ckpt_catalog *, ckpt_err *) = NULL;
    if (has_suffix(out, ".gguf"))
        writer = write_gguf;
    else if (has_suffix(out, ".bpk"))
        writer = write_burnpack;
    else if (has_suffix(out, ".lwt"))
        writer = write_lwt;
    bool gptrs = has_suffix(out, ".gptrs"), gptrsten = has_suffix(out, ".gptrsten");
    if (!writer && !gptrs && !gptrsten)
        return ckpt_fail(err, -EINVAL,
                         "%s: cannot tell the output format from the name (use .safetensors, "
                         ".gguf, .bpk, .lwt, .gptrs, .gptrsten, or a directory for HF shards)",
                         out);
    out_file f;
    int rc = out_open(&f, out, err);
    if (rc) return rc;
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
