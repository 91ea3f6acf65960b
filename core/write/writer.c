/* ckpt_write: the table of writers, and OUT's name -> the writer that writes it. A new output
 * format is one file in writers/ that defines its row, and one line here. */
#include "writer.h"

#include "../util/text.h"
#include "writers/writers.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

extern const ckpt_writer writer_safetensors, writer_gguf, writer_burnpack, writer_lwt, writer_gptrs,
    writer_gptrsten;

/* By suffix; the first row with write_dir writes directories (DIR/, --max-shard-size). */
static const ckpt_writer *const writers[] = {
    &writer_safetensors, &writer_gguf,  &writer_burnpack,
    &writer_lwt,         &writer_gptrs, &writer_gptrsten,
};
enum { NWRITERS = sizeof writers / sizeof *writers };

static char suffix_list[128];

static void build_suffix_list(void) {
    size_t at = 0;
    for (size_t i = 0; i < NWRITERS; i++) {
        int w = snprintf(suffix_list + at, sizeof suffix_list - at, "%s%s", i ? ", " : "",
                         writers[i]->suffix);
        if (w < 0 || (size_t)w >= sizeof suffix_list - at) break;
        at += (size_t)w;
    }
}

const char *ckpt_writer_suffixes(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, build_suffix_list);
    return suffix_list;
}

typedef struct target {
    char path[PATH_MAX]; /* OUT without a trailing '/' */
    bool compress;       /* NAME.EXT.zst */
    bool directory;
    const ckpt_writer *w;
} target;

static int resolve(const char *out, uint64_t max_shard_size, target *t, ckpt_err *err) {
    struct stat st;
    bool slash = text_ends_with(out, "/");
    bool is_dir = slash || (stat(out, &st) == 0 && S_ISDIR(st.st_mode));
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/') n--;
    if (n >= sizeof t->path) return ckpt_fail(err, -ENAMETOOLONG, "%s: path too long", out);
    memcpy(t->path, out, n);
    t->path[n] = '\0';
    t->compress = text_ends_with(t->path, ".zst");
    if (t->compress && (is_dir || max_shard_size))
        return ckpt_fail(err, -EINVAL,
                         "%s: a Hugging Face directory cannot be written as .zst (only single "
                         "files: NAME.safetensors.zst, NAME.gguf.zst, ...)",
                         out);
    char name[PATH_MAX];
    memcpy(name, t->path, n + 1);
    if (t->compress) name[n - 4] = '\0';
    t->w = NULL;
    for (size_t i = 0; i < NWRITERS && !slash && !t->w; i++)
        if (text_ends_with(name, writers[i]->suffix)) t->w = writers[i];
    /* A name with the suffix of a writer that also writes directories is its file, unless
     * shards are asked for; any other directory OUT is the directory writer's. */
    t->directory = (is_dir || max_shard_size) && !(t->w && t->w->write_dir && !max_shard_size);
    if (t->directory) {
        t->w = NULL;
        for (size_t i = 0; i < NWRITERS && !t->w; i++)
            if (writers[i]->write_dir) t->w = writers[i];
    }
    if (!t->w)
        return ckpt_fail(err, -EINVAL,
                         "%s: cannot tell the output format from the name (use %s, any of them "
                         "followed by .zst, or a directory for HF shards)",
                         out, ckpt_writer_suffixes());
    if (t->compress && !t->w->zst_ok)
        return ckpt_fail(err, -EINVAL, "%s: %s files cannot be written as .zst", out, t->w->suffix);
    return 0;
}

int ckpt_write_check_name(const char *out, const ckpt_write_opts *opts, ckpt_err *err) {
    target t;
    return resolve(out, opts ? opts->max_shard_size : 0, &t, err);
}

const ckpt_writer *ckpt_writer_for(const char *out) {
    target t;
    ckpt_err ignored;
    return resolve(out, 0, &t, &ignored) ? NULL : t.w;
}

int ckpt_write(const ckpt_catalog *cat, const char *out, const ckpt_write_opts *opts,
               ckpt_err *err) {
    ckpt_write_opts none = {0};
    if (!opts) opts = &none;
    target t;
    int rc = resolve(out, opts->max_shard_size, &t, err);
    if (rc) return rc;
    if (t.directory) return t.w->write_dir(cat, t.path, opts, err);
    out_file f;
    if ((rc = out_open(&f, t.path, t.compress, err))) return rc;
    out_limit_mode(&f, out_data_sources_mode(cat));
    uint64_t done = 0;
    f.progress = &opts->progress;
    f.publish = opts;
    f.progress_done = &done;
    for (size_t i = 0; i < cat->ntensors; i++)
        if (!cat->tensors[i].aside) f.progress_total += cat->tensors[i].nbytes;
    if ((rc = t.w->write(&f, cat, err))) {
        out_abort(&f);
        return rc;
    }
    return out_commit(&f);
}

int ckpt_write_check(const ckpt_catalog *cat, const char *out, const ckpt_write_opts *opts,
                     ckpt_err *err) {
    ckpt_write_opts none = {0};
    if (!opts) opts = &none;
    target t;
    int rc = resolve(out, opts->max_shard_size, &t, err);
    if (!rc && t.directory) rc = writer_dir_guard(cat, t.path, opts, err);
    return rc;
}
