/* ckpt_open: picks the decoder for a file by its first bytes, or treats a directory as a model
 * directory. */
#include "../io/blockcache.h"
#include "formats.h"
#include "../io/place.h"
#include "../io/remote/remote.h"
#include "../util/text.h"
#include "../io/zstd_seekable.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Compressed streams have no random access: ckptfs reads nothing through them. */
static const char *compression_of(const unsigned char *head, size_t n) {
    if (n >= 2 && head[0] == 0x1f && head[1] == 0x8b) return "gzip";
    if (n >= 3 && memcmp(head, "BZh", 3) == 0) return "bzip2";
    if (n >= 6 && memcmp(head,
                         "\xfd"
                         "7zXZ\0",
                         6) == 0)
        return "xz";
    return NULL;
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s && s[1] ? s + 1 : path;
}

/* The decoder whose magic the first bytes carry (formats without one excluded). */
const ckpt_format *ckpt_format_probe_bytes(const unsigned char *head, size_t n, uint64_t size) {
    for (const ckpt_format *const *t = ckpt_formats; *t; t++)
        if ((*t)->probe && !(*t)->no_magic && (*t)->probe(head, n, size)) return *t;
    return NULL;
}

const ckpt_format *ckpt_format_probe_path(const char *path) {
    unsigned char head[PROBE_BYTES];
    size_t n;
    uint64_t size;
    if (place_read_head(path, head, sizeof head, &n, &size) != 0 || n == 0) return NULL;
    return ckpt_format_probe_bytes(head, n, size);
}

/* The file's name ends in one of the format's suffixes (+ ".zst" for a seekable zstd file). */
static bool claims_name(const ckpt_format *f, const char *path, bool zst) {
    for (const char *const *s = f->suffixes; s && *s; s++) {
        if (text_ends_with(path, *s)) return true;
        char z[64];
        if (zst && snprintf(z, sizeof z, "%s.zst", *s) < (int)sizeof z && text_ends_with(path, z))
            return true;
    }
    return false;
}

/* The formats of the table as messages list them: file formats by label, or what the directory
 * probes look for. */
static void list_labels(char *out, size_t cap, bool dirs) {
    size_t at = 0;
    out[0] = '\0';
    for (const ckpt_format *const *t = ckpt_formats; *t; t++) {
        const char *s = dirs ? (*t)->dir_looks_for : (*t)->probe ? (*t)->label : NULL;
        if (!s) continue;
        int w = snprintf(out + at, cap - at, "%s%s", at ? ", " : "", s);
        if (w < 0 || (size_t)w >= cap - at) break;
        at += (size_t)w;
    }
}

static int open_file(ckpt_catalog *cat, const char *path, ckpt_err *err) {
    uint32_t src;
    int rc = catalog_add_source(cat, path, base_name(path), &src, err);
    if (rc) return rc;
    unsigned char head[PROBE_BYTES];
    uint64_t size = cat->sources[src].size;
    size_t n = size < sizeof head ? (size_t)size : sizeof head;
    if ((rc = ckpt_source_read(cat, src, 0, head, n, "the first bytes", err))) return rc;
    /* A seekable .zst was read through its seek table by catalog_add_source: head holds the
     * decompressed bytes. Plain zstd has no random access; ckptfs will not decompress it all. */
    if (!cat->sources[src].zst && zst_magic(head, n))
        return ckpt_fail(err, -EINVAL,
                         "%s: zstd file without a seek table (not seekable); decompress it "
                         "(zstd -d FILE) and mount the result, or make a seekable copy: zstd -d "
                         "FILE -o X && ckptfs convert X OUT.safetensors.zst",
                         path);
    const ckpt_format *f = NULL;
    for (const ckpt_format *const *t = ckpt_formats; *t && !f; t++)
        if ((*t)->probe && (*t)->probe(head, n, size)) f = *t;
    /* A damaged file gets its own decoder's precise complaint when its name says what it is. */
    for (const ckpt_format *const *t = ckpt_formats; *t && !f; t++)
        if ((*t)->load && claims_name(*t, path, cat->sources[src].zst != NULL)) f = *t;
    const char *packed = f ? NULL : compression_of(head, n);
    if (packed)
        return ckpt_fail(err, -EPROTONOSUPPORT,
                         "%s: %s-compressed (a .tar.gz, or a .nemo of old NeMo versions?); ckptfs "
                         "reads archives in place, so only uncompressed: decompress it once "
                         "(%s -dc FILE > FILE.tar) and mount that, or make one checkpoint file "
                         "of that with ckptfs convert FILE.tar OUT.safetensors",
                         path, packed, packed);
    if (!f) {
        char known[256];
        list_labels(known, sizeof known, false);
        return ckpt_fail(err, -EPROTONOSUPPORT,
                         "%s: not a checkpoint format ckptfs knows (first bytes match none of %s)",
                         path, known);
    }
    cat->format = f->name;
    return f->load(cat, src, err);
}

/* The catalog records the row's name, as open_file does; a loader may refine it. */
static int open_dir(ckpt_catalog *cat, ckpt_err *err) {
    for (const ckpt_format *const *t = ckpt_formats; *t; t++)
        if ((*t)->probe_dir && (*t)->probe_dir(cat->root)) {
            cat->format = (*t)->name;
            return (*t)->load_dir(cat, err);
        }
    int rc = place_list_failure(cat->root, err);
    if (rc) return rc;
    char repos[512];
    int nrepos = hf_cache_root_repos(cat->root, repos, sizeof repos);
    if (nrepos > 0)
        return ckpt_fail(err, -ENOENT,
                         "%s: a Hugging Face cache folder holding %d model repo%s, not one "
                         "checkpoint: give one of them as the SOURCE (%s)",
                         cat->root, nrepos, nrepos == 1 ? "" : "s", repos);
    char looked[1024];
    list_labels(looked, sizeof looked, true);
    return ckpt_fail(err, -ENOENT, "%s: no checkpoint in this directory (looked for %s)", cat->root,
                     looked);
}

/* By the format the catalog records: a folder or an archive of one checkpoint file records
 * that file's format, and its checks ran. */
const char *ckpt_format_checks(const ckpt_catalog *cat) {
    const ckpt_format *f = cat->format ? ckpt_format_named(cat->format) : NULL;
    return f && f->integrity ? f->integrity
                             : "structure; the format stores no checksums of tensor data";
}

/* Where a URL points, as the root shows it (no secrets): an hf:// name is pinned to the commit
 * its revision points at now. Its kind in *kind. */
static int remote_root(const char *path, const ckpt_options *opts, char *root, int *kind,
                       ckpt_err *err) {
    ckpt_remote_options none = {0};
    int rc = remote_configure(opts ? &opts->remote : &none, err);
    if (rc) return rc;
    char shown[PATH_MAX];
    remote_shown(path, shown, sizeof shown);
    if ((rc = remote_pin(shown, root, PATH_MAX, err))) return rc;
    *kind = place_kind(root);
    if (*kind == PLACE_MISSING) {
        /* Opening it says why precisely (404, 403, no Range support...). */
        remote_object *o;
        if ((rc = remote_open(root, &o, err))) return rc;
        remote_close(o);
        *kind = PLACE_FILE;
    }
    return 0;
}

/* A local path: its kind, and the absolute path the root shows (the daemon changes directory,
 * and a replaced source is detected by looking its path up again). */
static int local_root(const char *path, char *root, int *kind, ckpt_err *err) {
    struct stat st;
    if (stat(path, &st) != 0) {
        int e = errno;
        return ckpt_fail(err, -e, "%s: %s", path, strerror(e));
    }
    *kind = S_ISREG(st.st_mode) ? PLACE_FILE : S_ISDIR(st.st_mode) ? PLACE_DIR : PLACE_OTHER;
    if (*kind == PLACE_OTHER)
        return ckpt_fail(err, -EINVAL, "%s: %s, neither a regular file nor a directory", path,
                         source_file_type_name(st.st_mode));
    if (!realpath(path, root)) {
        int e = errno;
        return ckpt_fail(err, -e, "%s: %s", path, strerror(e));
    }
    return 0;
}

/* The same decoders over local paths and URLs: only finding the root differs. */
int ckpt_open(const char *path, const ckpt_options *opts, ckpt_catalog **out, ckpt_err *err) {
    *out = NULL;
    bool remote = remote_is_url(path);
    char root[PATH_MAX];
    int kind = PLACE_MISSING;
    int rc =
        remote ? remote_root(path, opts, root, &kind, err) : local_root(path, root, &kind, err);
    if (rc) return rc;
    /* An HF cache repo folder stands for one of its snapshots (remotely: a copy of one in a
     * bucket or on a web server, its snapshot links followed when it was uploaded). */
    strbuf cache_doc;
    sb_init(&cache_doc);
    const char *revision = opts ? opts->revision : NULL;
    if (kind == PLACE_DIR && hf_cache_probe(root)) {
        char snapshot[PATH_MAX];
        rc = hf_cache_resolve(root, revision, snapshot, sizeof snapshot, &cache_doc, err);
        if (!rc && !remote && !realpath(snapshot, root))
            rc = ckpt_fail(err, -errno, "%s: %s", snapshot, strerror(errno));
        else if (!rc && remote)
            memcpy(root, snapshot, strlen(snapshot) + 1);
    } else if (revision) {
        rc = ckpt_fail(err, -EINVAL,
                       "%s: -o revision= needs a Hugging Face cache repo folder "
                       "(models--ORG--NAME with refs/ and snapshots/)",
                       path);
    }
    ckpt_catalog *cat = NULL;
    if (!rc && !(cat = catalog_new(root, "unknown"))) rc = ckpt_fail(err, -ENOMEM, "out of memory");
    if (!rc) {
        if (opts) cat->opts = *opts;
        rc = kind == PLACE_DIR ? open_dir(cat, err) : open_file(cat, root, err);
    }
    /* Only tensor-parallel checkpoints are split: elsewhere the option would do nothing, and
     * a user who believes it did is misled. */
    if (!rc && cat->opts.tp_split && strcmp(cat->format, "mlframework-tp") != 0)
        rc = ckpt_fail(err, -EINVAL,
                       "%s: tp_split=%s: only MLFramework tensor-parallel checkpoints are split "
                       "by rank; this is %s (leave the option out)",
                       path, cat->opts.tp_split, cat->format);
    if (!rc && cache_doc.len)
        rc = catalog_add_doc(cat, "hf_cache", cache_doc.data, cache_doc.len, err);
    sb_free(&cache_doc);
    if (!rc) rc = catalog_finish(cat, err);
    /* Prefetch threads started while decoding stop here: a mount forks next. */
    if (remote) bc_quiesce();
    if (rc) {
        ckpt_close(cat);
        return rc;
    }
    *out = cat;
    return 0;
}
