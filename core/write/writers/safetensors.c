/* The safetensors writer: the HF view's files (hfview.c), written out — one file, compressed or
 * not, or a Hugging Face directory of shards + index + the config and tokenizer files. */
#include "writers.h"
#include "../writer.h"

#include "../../model/catalog.h"
#include "../../views/hfview.h"
#include "../../util/utf8.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
        if (ckpt_safetensors_reserved_name(t->name, t->name_len))
            return ckpt_fail(err, -EINVAL,
                             "tensor \"__metadata__\": a safetensors header keeps that key for "
                             "its metadata, so no safetensors file can hold a tensor of that "
                             "name; rename it or leave it out (convert: --exclude __metadata__), "
                             "or write another format");
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

static int write_file(const char *path, const ckpt_catalog *cat, const ckpt_vfile *vf,
                      const ckpt_write_opts *opts, uint64_t total, uint64_t *done, ckpt_err *err) {
    out_file f;
    int rc = out_open(&f, path, false, err);
    if (rc) return rc;
    out_limit_mode(&f, out_data_sources_mode(cat));
    f.progress = &opts->progress;
    f.progress_total = total;
    f.progress_done = done;
    out_vfile(&f, cat, vf);
    return out_commit(&f);
}

/* One file, as the HF view without shards shows it: into an opened (maybe compressed) OUT. */
static int write_one(out_file *f, const ckpt_catalog *cat, ckpt_err *err) {
    int rc = check_safetensors_fit(cat, err);
    if (rc) return rc;
    ckpt_hfview view;
    if ((rc = ckpt_hfview_build(cat, 0, &view, err))) return rc;
    f->progress_total = view_bytes(&view); /* the header counts too */
    out_vfile(f, cat, &view.files[0].vf);
    ckpt_hfview_free(&view);
    return 0; /* a failed write is f->failed, reported by out_commit */
}

int writer_dir_aux(const ckpt_catalog *cat, const char *tmp, ckpt_err *err) {
    int rc = 0;
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
    mode_t readable = cat->nsources ? out_data_sources_mode(cat) & 0044 : 0044;
    for (size_t i = 0; i < cat->naux; i++) readable &= cat->sources[cat->aux[i].source].mode;
    chmod(tmp, (0777 & ~ckpt_umask()) & (0700 | readable | readable >> 2));
    return rc;
}

/* An HF directory of plain files: shards of at most max_shard_size, the index, and the config
 * and tokenizer files. */
static int write_dir(const ckpt_catalog *cat, const char *out, const ckpt_write_opts *opts,
                     ckpt_err *err) {
    int rc = check_safetensors_fit(cat, err);
    if (!rc) rc = writer_dir_guard(cat, out, opts, err);
    if (rc) return rc;
    ckpt_hfview view;
    uint64_t shard = opts->max_shard_size ? opts->max_shard_size : CKPT_HF_MAX_SHARD_DEFAULT;
    if ((rc = ckpt_hfview_build(cat, shard, &view, err))) return rc;
    uint64_t total = view_bytes(&view), done = 0;
    /* A directory appears whole or not at all: build it under a temporary name. */
    char tmp[PATH_MAX];
    if ((rc = writer_dir_temp(out, tmp, sizeof tmp, err))) {
        ckpt_hfview_free(&view);
        return rc;
    }
    for (size_t i = 0; !rc && i < view.nfiles; i++) {
        char path[PATH_MAX];
        rc = join(path, sizeof path, tmp, view.files[i].name, err);
        if (!rc) rc = write_file(path, cat, &view.files[i].vf, opts, total, &done, err);
    }
    if (!rc) rc = writer_dir_aux(cat, tmp, err);
    if (!rc) rc = writer_publish_dir(tmp, out, opts, err);
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
    }
    ckpt_hfview_free(&view);
    return rc;
}

const ckpt_writer writer_safetensors = {
    .suffix = ".safetensors",
    .write = write_one,
    .write_dir = write_dir,
    .zst_ok = true,
};
