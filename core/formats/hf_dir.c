/* A Hugging Face model directory: model.safetensors, or model.safetensors.index.json naming
 * shards, or the torch-pickle equivalents pytorch_model.bin and pytorch_model.bin.index.json.
 * transformers' order decides which one is loaded when several are there: safetensors before
 * .bin, the single file before the index; summary.json says which won over which. Shards are
 * read wherever their symlinks lead (an HF cache snapshot links into ../../blobs/); only the
 * names the index itself gives are held to the directory. Config and tokenizer files are kept
 * as auxiliary files for the HF view. */
#include "../io/place.h"
#include "formats.h"

#include "../util/hashmap.h"
#include "../util/json.h"
#include "../util/pipeline.h"
#include "../util/strbuf.h"
#include "safetensors.h"
#include "torch_zip.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static bool is_file(const char *path) {
    return place_kind(path) == PLACE_FILE;
}

static int join(char *out, size_t cap, const char *dir, const char *name, ckpt_err *err) {
    int n = snprintf(out, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap)
        return ckpt_fail(err, -ENAMETOOLONG, "%s/%s: path too long", dir, name);
    return 0;
}

/* A shard name from the index: a string, relative, no ".." component. */
static int check_shard_name(const json_value *v, const char *index_path, ckpt_err *err) {
    if (v->type != JSON_STRING)
        return ckpt_fail(err, -EINVAL,
                         "%s: weight_map value of \"%.*s\" is not a string (byte "
                         "offset %zu)",
                         index_path, SHOWN_NAME(v->key, v->key_len), v->pos);
    bool bad = v->len == 0 || v->str[0] == '/' || memchr(v->str, '\0', v->len);
    for (size_t s = 0, i = 0; !bad && i <= v->len; i++) {
        if (i == v->len || v->str[i] == '/') {
            if (i - s == 2 && v->str[s] == '.' && v->str[s + 1] == '.') bad = true;
            s = i + 1;
        }
    }
    if (bad)
        return ckpt_fail(err, -EINVAL,
                         "%s: weight_map entry \"%.*s\" names \"%.*s\", which is "
                         "not inside the model directory (byte offset %zu)",
                         index_path, SHOWN_NAME(v->key, v->key_len), SHOWN_NAME(v->str, v->len),
                         v->pos);
    return 0;
}

/* A shard file: exists and is a regular file. Where its symlinks lead is the user's business
 * (an HF cache snapshot links every file into ../../blobs/); only the index's own text is
 * held to the directory, by check_shard_name. Checked once per distinct shard. */
static int check_shard_file(const char *root, const json_value *v, const char *index_path,
                            ckpt_err *err) {
    char path[PATH_MAX];
    int n = snprintf(path, sizeof path, "%s/%.*s", root, (int)v->len, v->str);
    if (n < 0 || (size_t)n >= sizeof path)
        return ckpt_fail(err, -ENAMETOOLONG, "%s: shard name too long", index_path);
    int kind = place_kind(path); /* a local path or a URL */
    if (kind == PLACE_MISSING)
        return ckpt_fail(err, -ENOENT,
                         "%s: shard \"%.*s\" named in weight_map (byte offset %zu) is missing",
                         index_path, SHOWN_NAME(v->str, v->len), v->pos);
    struct stat st;
    if (kind != PLACE_FILE)
        return ckpt_fail(err, -EINVAL,
                         "%s: shard \"%.*s\" named in weight_map (byte offset %zu): %s is %s, "
                         "not a regular file",
                         index_path, SHOWN_NAME(v->str, v->len), v->pos, path,
                         stat(path, &st) == 0 ? source_file_type_name(st.st_mode) : "a directory");
    return 0;
}

static int shard_cmp(const void *a, const void *b) {
    const json_value *x = *(const json_value *const *)a, *y = *(const json_value *const *)b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->str, y->str, n);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* transformers loads every tensor of every listed shard and only warns about names the index
 * gets wrong, so mismatches are warnings in the summary, not errors. */
static int check_weight_map(ckpt_catalog *cat, const json_value *wm, size_t first_tensor,
                            const char *index_path, ckpt_err *err) {
    size_t n = cat->ntensors - first_tensor;
    uint32_t *src_of = calloc(n ? n : 1, sizeof *src_of);
    hashmap names;
    if (!src_of || !hm_init(&names, n)) {
        free(src_of);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) { /* a shard's tensor has one piece, added first */
        const ckpt_tensor *t = &cat->tensors[first_tensor + i];
        if (t->npieces) src_of[i] = t->pieces[0].source;
    }
    bool added;
    for (size_t i = 0; i < n; i++) {
        const ckpt_tensor *t = &cat->tensors[first_tensor + i];
        if (!hm_put(&names, t->name, t->name_len, i, &added)) {
            hm_free(&names);
            free(src_of);
            return ckpt_fail(err, -ENOMEM, "out of memory");
        }
    }
    size_t missing = 0, misplaced = 0, listed = 0;
    for (const json_value *e = wm->head; e; e = e->next) {
        const hm_entry *h = hm_get(&names, e->key, e->key_len);
        if (!h) {
            if (missing++ == 0)
                catalog_warn(cat, "%s: \"%.*s\" is in weight_map but in no shard", index_path,
                             SHOWN_NAME(e->key, e->key_len));
            continue;
        }
        listed++;
        const char *rel = cat->sources[src_of[h->value]].relpath;
        if (strlen(rel) != e->len || memcmp(rel, e->str, e->len) != 0) {
            if (misplaced++ == 0)
                catalog_warn(cat, "%s: weight_map puts \"%.*s\" in %.*s but it is in %s",
                             index_path, SHOWN_NAME(e->key, e->key_len), SHOWN_NAME(e->str, e->len),
                             rel);
        }
    }
    if (missing > 1)
        catalog_warn(cat, "%s: %zu weight_map names are in no shard", index_path, missing);
    if (misplaced > 1)
        catalog_warn(cat, "%s: %zu weight_map names point at the wrong shard", index_path,
                     misplaced);
    if (listed < n)
        catalog_warn(cat, "%s: %zu tensors in the shards are not in weight_map", index_path,
                     n - listed);
    hm_free(&names);
    free(src_of);
    return 0;
}

/* Shard headers are read ahead on a second thread (pipeline.h) and added in shard order. */
typedef struct shard_run {
    ckpt_catalog *cat;
    uint32_t first_source;
    ckpt_err *err;
} shard_run;

typedef struct shard_slot {
    st_header h;
    ckpt_err err;
} shard_slot;

static int read_shard(void *ctx, size_t i, void *slot) {
    const shard_run *r = ctx;
    shard_slot *s = slot;
    return safetensors_read_header(r->cat, r->first_source + (uint32_t)i, &s->h, &s->err);
}

static int add_shard(void *ctx, size_t i, void *slot, int prepared) {
    shard_run *r = ctx;
    shard_slot *s = slot;
    if (prepared) {
        *r->err = s->err;
        return prepared;
    }
    int rc = safetensors_add_tensors(r->cat, r->first_source + (uint32_t)i, &s->h, r->err);
    safetensors_header_free(&s->h);
    return rc;
}

static void drop_shard(void *ctx, size_t i, void *slot, int prepared) {
    (void)ctx, (void)i;
    if (!prepared) safetensors_header_free(&((shard_slot *)slot)->h);
}

/* Remote shards are opened all at once (one round trip for all), not one after another. */
static int warm_shards(const char *root, const json_value **shards, size_t n, ckpt_err *err) {
    if (!ckpt_is_url(root) || n < 2) return 0;
    char **paths = calloc(n, sizeof *paths);
    if (!paths) return ckpt_fail(err, -ENOMEM, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (i && shard_cmp(&shards[i - 1], &shards[i]) == 0) continue;
        size_t len = strlen(root) + shards[i]->len + 2;
        if (!(paths[k] = malloc(len))) break;
        snprintf(paths[k++], len, "%s/%.*s", root, (int)shards[i]->len, shards[i]->str);
    }
    place_warm((const char *const *)paths, k);
    for (size_t i = 0; i < k; i++) free(paths[i]);
    free(paths);
    return 0;
}

/* The shards of a .bin index, one after another: each torch file's documents are kept
 * under its name. */
static int load_torch_shards(ckpt_catalog *cat, uint32_t first_source, size_t nfiles,
                             ckpt_err *err) {
    for (size_t i = 0; i < nfiles; i++) {
        uint32_t src = first_source + (uint32_t)i;
        size_t first_doc = cat->ndocs;
        int rc = format_torch_zip.load(cat, src, err);
        if (!rc) rc = catalog_prefix_docs(cat, first_doc, cat->sources[src].relpath, err);
        if (rc) return rc;
    }
    return 0;
}

static int load_index(ckpt_catalog *cat, const char *index_rel, bool torch, ckpt_err *err) {
    char index_path[PATH_MAX];
    int rc = join(index_path, sizeof index_path, cat->root, index_rel, err);
    if (rc) return rc;
    uint32_t isrc;
    if ((rc = catalog_add_source(cat, index_path, index_rel, &isrc, err))) return rc;
    uint64_t size = cat->sources[isrc].size;
    if (size > 512u << 20)
        return ckpt_fail(err, -EFBIG, "%s: index is %llu bytes, over the 512 MiB limit", index_path,
                         (unsigned long long)size);
    char *text = malloc(size ? size : 1);
    if (!text) return ckpt_fail(err, -ENOMEM, "out of memory");
    if ((rc = ckpt_source_read(cat, isrc, 0, text, size, "index", err))) {
        free(text);
        return rc;
    }
    json_doc doc;
    json_error jerr;
    if ((rc = json_parse(&doc, text, size, &jerr))) {
        free(text);
        return ckpt_fail(err, rc, "%s: index JSON: %s (byte offset %zu)", index_path, jerr.msg,
                         jerr.pos);
    }
    const json_value **shards = NULL;
    const json_value *wm = json_member(doc.root, "weight_map");
    if (!wm || wm->type != JSON_OBJECT) {
        rc = ckpt_fail(err, -EINVAL, "%s: weight_map is missing or not an object", index_path);
        goto out;
    }
    shards = malloc((wm->count ? wm->count : 1) * sizeof *shards);
    if (!shards) {
        rc = ckpt_fail(err, -ENOMEM, "out of memory");
        goto out;
    }
    size_t n = 0;
    for (const json_value *e = wm->head; e; e = e->next) {
        if ((rc = check_shard_name(e, index_path, err))) goto out;
        /* Neighbours mostly name the same shard: keep one of each run before sorting. */
        if (n == 0 || shard_cmp(&shards[n - 1], &e) != 0) shards[n++] = e;
    }
    /* The shards transformers loads: sorted unique weight_map values. All are registered
     * first, so that the catalog's sources stay put while headers are read on two threads. */
    qsort(shards, n, sizeof *shards, shard_cmp);
    size_t first_tensor = cat->ntensors, nfiles = 0;
    uint32_t first_source = cat->nsources;
    if ((rc = warm_shards(cat->root, shards, n, err))) goto out;
    for (size_t i = 0; i < n; i++) {
        if (i && shard_cmp(&shards[i - 1], &shards[i]) == 0) continue;
        if ((rc = check_shard_file(cat->root, shards[i], index_path, err))) goto out;
        char rel[PATH_MAX], path[PATH_MAX];
        snprintf(rel, sizeof rel, "%.*s", (int)shards[i]->len, shards[i]->str);
        uint32_t src;
        if ((rc = join(path, sizeof path, cat->root, rel, err)) ||
            (rc = catalog_add_source(cat, path, rel, &src, err)))
            goto out;
        nfiles++;
    }
    shard_run run = {cat, first_source, err};
    static const ckpt_pipeline_ops shard_ops = {read_shard, add_shard, drop_shard};
    rc = torch ? load_torch_shards(cat, first_source, nfiles, err)
               : ckpt_pipeline_run(nfiles, sizeof(shard_slot), 4, &shard_ops, &run);
    if (rc) goto out;
    if ((rc = check_weight_map(cat, wm, first_tensor, index_path, err))) goto out;
    const json_value *meta = json_member(doc.root, "metadata");
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "{\"metadata\": ");
    if (meta && meta->type == JSON_OBJECT) {
        /* Re-emit only the scalar members; total_size and friends are numbers or strings. */
        sb_putc(&sb, '{');
        bool first = true;
        for (const json_value *m = meta->head; m; m = m->next) {
            if (m->type != JSON_NUMBER && m->type != JSON_STRING) continue;
            if (!first) sb_puts(&sb, ", ");
            first = false;
            sb_json_str(&sb, m->key, m->key_len);
            sb_puts(&sb, ": ");
            if (m->type == JSON_NUMBER)
                sb_put(&sb, m->str, m->len);
            else
                sb_json_str(&sb, m->str, m->len);
        }
        sb_putc(&sb, '}');
    } else {
        sb_puts(&sb, "null");
    }
    sb_printf(&sb, ", \"weight_map_entries\": %u}", wm->count);
    rc = sb.failed ? ckpt_fail(err, -ENOMEM, "out of memory")
                   : catalog_add_doc(cat, index_rel, sb.data, sb.len, err);
    sb_free(&sb);
out:
    free(shards);
    json_doc_free(&doc);
    free(text);
    return rc;
}

/* transformers' order: safetensors before .bin, the single file before the index. */
static const struct weights_file {
    const char *name;
    bool index, torch;
    const char *format;
} weights_files[] = {
    {"model.safetensors", false, false, "safetensors"},
    {"model.safetensors.index.json", true, false, "safetensors-sharded"},
    {"pytorch_model.bin", false, true, "torch-bin"},
    {"pytorch_model.bin.index.json", true, true, "torch-bin-sharded"},
};
enum { NWEIGHTS = sizeof weights_files / sizeof *weights_files };

bool hf_dir_probe(const char *dir) {
    char path[PATH_MAX];
    for (size_t i = 0; i < NWEIGHTS; i++)
        if (snprintf(path, sizeof path, "%s/%s", dir, weights_files[i].name) < (int)sizeof path &&
            is_file(path))
            return true;
    return false;
}

/* summary.json's "weights": the file loaded and the ones it won over. */
static int note_choice(ckpt_catalog *cat, size_t chosen, const bool present[NWEIGHTS],
                       ckpt_err *err) {
    strbuf sb;
    sb_init(&sb);
    sb_printf(&sb, "\"weights\": {\"loaded\": \"%s\", \"not_loaded\": [",
              weights_files[chosen].name);
    bool first = true;
    for (size_t i = chosen + 1; i < NWEIGHTS; i++) {
        if (!present[i]) continue;
        sb_printf(&sb, "%s\"%s\"", first ? "" : ", ", weights_files[i].name);
        first = false;
    }
    sb_puts(&sb, "], \"rule\": \"safetensors before .bin, the single file before the index, "
                 "as transformers chooses\"}");
    int rc = sb.failed ? ckpt_fail(err, -ENOMEM, "out of memory")
                       : catalog_set_summary_extra(cat, sb.data, err);
    sb_free(&sb);
    return rc;
}

/* The most side files other than the usual names a folder's top may carry. */
enum { HF_SIDE_FILES_MAX = 256 };

static bool usual_aux(const char *name) {
    for (size_t i = 0; i < ckpt_hf_aux_count; i++)
        if (strcmp(name, ckpt_hf_aux_names[i]) == 0) return true;
    return false;
}

int hf_dir_load(ckpt_catalog *cat, ckpt_err *err) {
    char path[PATH_MAX];
    bool present[NWEIGHTS];
    size_t chosen = NWEIGHTS, npresent = 0;
    int rc;
    for (size_t i = 0; i < NWEIGHTS; i++) {
        if ((rc = join(path, sizeof path, cat->root, weights_files[i].name, err))) return rc;
        present[i] = is_file(path);
        npresent += present[i];
        if (present[i] && chosen == NWEIGHTS) chosen = i;
    }
    if (chosen == NWEIGHTS)
        return ckpt_fail(err, -ENOENT,
                         "%s: no model.safetensors, model.safetensors.index.json, "
                         "pytorch_model.bin or pytorch_model.bin.index.json in this directory",
                         cat->root);
    const struct weights_file *w = &weights_files[chosen];
    cat->format = w->format;
    if (w->index) {
        rc = load_index(cat, w->name, w->torch, err);
    } else {
        uint32_t src;
        if ((rc = join(path, sizeof path, cat->root, w->name, err)) ||
            (rc = catalog_add_source(cat, path, w->name, &src, err)))
            return rc;
        rc = (w->torch ? format_torch_zip : format_safetensors).load(cat, src, err);
    }
    if (!rc && npresent > 1) rc = note_choice(cat, chosen, present, err);
    if (rc) return rc;
    /* Every side file of the folder (ckpt_hf_aux_name), not only the usual names: a convert,
     * the view and serve must not drop sentencepiece.bpe.model, tokenizer.tiktoken, LICENSE... */
    char **names;
    size_t n;
    if ((rc = dirlist_files(cat->root, "", &names, &n)))
        return ckpt_fail(err, rc, "%s: cannot list: %s", cat->root, strerror(-rc));
    /* Each side file is a source opened now (a request for a remote folder): a folder of
     * thousands of text files beside the weights is no model's top, and carrying them all
     * would cost one open each. Past the bound, only the usual names are carried. */
    size_t unusual = 0;
    for (size_t i = 0; i < n; i++) unusual += ckpt_hf_aux_name(names[i]) && !usual_aux(names[i]);
    bool all = unusual <= HF_SIDE_FILES_MAX;
    if (!all)
        catalog_warn(cat,
                     "%s: %zu side files beside the weights, over %d: only the usual ones "
                     "(config.json, tokenizer files, ...) are carried",
                     cat->root, unusual, HF_SIDE_FILES_MAX);
    for (size_t i = 0; !rc && i < n; i++) {
        if (!ckpt_hf_aux_name(names[i]) || (!all && !usual_aux(names[i]))) continue;
        uint32_t src;
        if (!(rc = join(path, sizeof path, cat->root, names[i], err)) &&
            !(rc = catalog_add_source(cat, path, names[i], &src, err)))
            rc = catalog_add_aux(cat, names[i], src, err);
    }
    dirlist_free(names, n);
    return rc;
}

const ckpt_format format_hf_dir = {
    .name = "hf-dir",
    .label = "Hugging Face model directory",
    .probe_dir = hf_dir_probe,
    .load_dir = hf_dir_load,
    .dir_looks_for = "model.safetensors, model.safetensors.index.json, pytorch_model.bin, "
                     "pytorch_model.bin.index.json",
};
