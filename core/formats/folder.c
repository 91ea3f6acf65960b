/* A folder of single-file checkpoints: what is left when a directory is no model directory of
 * a known layout. Every regular, non-hidden file whose first bytes are a checkpoint format
 * (GGUF, torch zip or legacy pickle, safetensors, gpt-rs, Burnpack, .lwt; chosen by content as
 * for a file mount) is one checkpoint, except that the parts of a split GGUF
 * (PREFIX-0000i-of-0000N.gguf) are one model, loaded from its first part. Other files
 * (README.md, config.json, ...) are left alone.
 *
 * One checkpoint: it is the model, shown at the root as if its file were mounted. Several
 * (tiny-F16.gguf and tiny-Q8_0.gguf, step100.pt and step200.pt): each is shown as a subtree
 * named after its file, and none of them is "the" model: their tensors are set aside (out of
 * the totals and the HF view, which would otherwise mix models) and summary.json lists the
 * checkpoints with their own counts. */
#include "formats.h"

#include "../io/place.h"
#include "../util/strbuf.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* True for NAME-%05d-of-%05d.gguf with a part number other than 1: loaded with part 1. */
static bool later_split_part(const char *name) {
    size_t n = strlen(name);
    const char *tail = "-00001-of-00001.gguf";
    size_t tl = strlen(tail);
    if (n <= tl || strcmp(name + n - 5, ".gguf") != 0) return false;
    const char *p = name + n - tl;
    for (size_t i = 0; i < tl; i++) {
        bool digit = tail[i] >= '0' && tail[i] <= '9';
        if (digit ? (p[i] < '0' || p[i] > '9') : p[i] != tail[i]) return false;
    }
    return strncmp(p, "-00001-", 7) != 0;
}

typedef struct candidate {
    char *name;
    const ckpt_format *format;
} candidate;

/* The checkpoint files of dir, sorted by name. */
static int find_checkpoints(ckpt_catalog *cat, candidate **out, size_t *count, ckpt_err *err) {
    char **names;
    size_t n;
    int rc = dirlist_files(cat->root, "", &names, &n);
    if (rc) return ckpt_fail(err, rc, "%s: cannot list: %s", cat->root, strerror(-rc));
    candidate *c = calloc(n ? n : 1, sizeof *c);
    if (!c) {
        dirlist_free(names, n);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    /* Remote files are opened in parallel first: each probe then costs no round trip. */
    char **paths = calloc(n ? n : 1, sizeof *paths);
    size_t np = 0;
    for (size_t i = 0; paths && i < n; i++) {
        if (names[i][0] == '.' || later_split_part(names[i])) continue;
        size_t len = strlen(cat->root) + strlen(names[i]) + 2;
        if (!(paths[np] = malloc(len))) break;
        snprintf(paths[np++], len, "%s/%s", cat->root, names[i]);
    }
    if (paths) place_warm((const char *const *)paths, np);
    dirlist_free(paths, np);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (names[i][0] == '.' || later_split_part(names[i])) continue;
        char path[PATH_MAX];
        int w = snprintf(path, sizeof path, "%s/%s", cat->root, names[i]);
        if (w < 0 || (size_t)w >= sizeof path) continue;
        const ckpt_format *f = ckpt_format_probe_path(path);
        if (!f) continue;
        c[k].name = names[i];
        c[k].format = f;
        names[i] = NULL;
        k++;
    }
    dirlist_free(names, n);
    *out = c;
    *count = k;
    return 0;
}

bool folder_probe(const char *dir) {
    char **names;
    size_t n;
    if (dirlist_files(dir, "", &names, &n)) return false;
    bool found = false;
    for (size_t i = 0; i < n && !found; i++) {
        char path[PATH_MAX];
        int w = snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        found =
            names[i][0] != '.' && w > 0 && (size_t)w < sizeof path && ckpt_format_probe_path(path);
    }
    dirlist_free(names, n);
    return found;
}

/* Loads one registered checkpoint file; with a subtree, its tensors go under "NAME/", aside. */
static int load_one(ckpt_catalog *cat, uint32_t src, const ckpt_format *f, bool subtree,
                    strbuf *list, ckpt_err *err) {
    const char *name = cat->sources[src].relpath;
    size_t first_tensor = cat->ntensors, first_doc = cat->ndocs;
    cat->format = f->name;
    int rc = f->load(cat, src, err);
    if (rc || !subtree) return rc;
    if ((rc = catalog_prefix_docs(cat, first_doc, name, err))) return rc;
    uint64_t params = 0, bytes = 0;
    size_t len = strlen(name);
    for (size_t i = first_tensor; i < cat->ntensors; i++) {
        ckpt_tensor *t = &cat->tensors[i];
        const char *inner = t->prefix ? t->prefix : "";
        size_t cap = len + strlen(inner) + 2;
        char *prefix = malloc(cap);
        if (!prefix) return ckpt_fail(err, -ENOMEM, "out of memory");
        snprintf(prefix, cap, "%s/%s", name, inner);
        if (!t->aside) params += t->numel, bytes += t->nbytes;
        rc = catalog_set_prefix(cat, i, prefix, true, err);
        free(prefix);
        if (rc) return rc;
    }
    sb_puts(list, list->len ? ",\n    {\"file\": " : "\n    {\"file\": ");
    sb_json_str(list, name, strlen(name));
    sb_printf(list, ", \"format\": \"%s\", \"dir\": ", cat->format);
    sb_json_str(list, name, strlen(name));
    sb_printf(list, ", \"tensors\": %zu, \"parameters\": %llu, \"bytes\": %llu}",
              cat->ntensors - first_tensor, (unsigned long long)params, (unsigned long long)bytes);
    return 0;
}

int folder_load_set(ckpt_catalog *cat, const uint32_t *sources, const ckpt_format *const *formats,
                    size_t n, const char *set_format, ckpt_err *err) {
    strbuf list;
    sb_init(&list);
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++)
        rc = load_one(cat, sources[i], formats[i], n > 1, &list, err);
    if (!rc && n > 1) {
        cat->format = set_format;
        strbuf sb;
        sb_init(&sb);
        sb_puts(&sb, "\"checkpoints\": [");
        sb_put(&sb, list.data, list.len);
        sb_puts(&sb, "\n  ]");
        rc = sb.failed || list.failed ? ckpt_fail(err, -ENOMEM, "out of memory")
                                      : catalog_set_summary_extra(cat, sb.data, err);
        sb_free(&sb);
    }
    sb_free(&list);
    return rc;
}

int folder_load(ckpt_catalog *cat, ckpt_err *err) {
    candidate *c = NULL;
    size_t n = 0;
    int rc = find_checkpoints(cat, &c, &n, err);
    if (rc) return rc;
    uint32_t *srcs = calloc(n ? n : 1, sizeof *srcs);
    const ckpt_format **fmts = calloc(n ? n : 1, sizeof *fmts);
    if (!srcs || !fmts) rc = ckpt_fail(err, -ENOMEM, "out of memory");
    if (!rc && n == 0)
        rc = ckpt_fail(err, -ENOENT, "%s: no checkpoint file in this directory", cat->root);
    /* All registered first: a split GGUF's first part registers its other parts as it loads. */
    for (size_t i = 0; i < n && !rc; i++) {
        char path[PATH_MAX];
        int w = snprintf(path, sizeof path, "%s/%s", cat->root, c[i].name);
        if (w < 0 || (size_t)w >= sizeof path)
            rc = ckpt_fail(err, -ENAMETOOLONG, "%s/%s: path too long", cat->root, c[i].name);
        else
            rc = catalog_add_source(cat, path, c[i].name, &srcs[i], err);
        fmts[i] = c[i].format;
    }
    if (!rc) rc = folder_load_set(cat, srcs, fmts, n, "folder", err);
    for (size_t i = 0; i < n; i++) free(c[i].name);
    free(c);
    free(srcs);
    free(fmts);
    return rc;
}

const ckpt_format format_folder = {
    .name = "folder",
    .label = "folder of checkpoint files",
    .probe_dir = folder_probe,
    .load_dir = folder_load,
    .dir_looks_for = "checkpoint files of a known format",
};
