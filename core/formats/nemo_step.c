/* NeMo Automodel checkpoints: a step directory (epoch_0_step_20/) holding
 *   model/                 the model: DCP-HF shards (shard-0000R-model-00001-of-00001.safetensors),
 *                          or native DCP (.metadata + __R_N.distcp, model_save_format torch_save),
 *                          or a PEFT adapter (adapter_model.safetensors + adapter_config.json)
 *   model/consolidated/    optional HF copy: model-0000i-of-0000N.safetensors + index + config
 *   model/.hf_metadata/    config.json, generation_config.json, tokenizer files (newer versions)
 *   optim/                 optimizer state, always native DCP
 *   config.yaml, losses.json, step_scheduler.pt, dataloader/, rng/   training state
 * and, mounted on their own, a model/ directory of such a step (recognised by .hf_metadata/ or
 * consolidated/ next to its shards) or a bare PEFT adapter directory.
 *
 * Tree: the model's tensors under model/ (aside = false: the HF view holds them under their own
 * names, the totals count them), an adapter's under adapter/ (at the root when the mounted
 * directory is only an adapter: then the adapter is all there is), optimizer state under optim/
 * (aside). .ckptfs/hf/ gets config and tokenizer files from, in this order (the first copy of a
 * name wins): consolidated/ when it backs the model, .hf_metadata/, consolidated/, model/. For an
 * adapter it also gets adapter_config.json and adapter_model.safetensors as they are, so PEFT
 * loads .ckptfs/hf/ directly (the synthesized model.safetensors beside them holds the same
 * adapter tensors). step_scheduler.pt's values go to metadata.json ("nemo"), the other training
 * files are only listed there.
 *
 * Sharded or consolidated? When model/ has both, the shards back model/: they are what a resumed
 * run loads (the source of truth), while the consolidated copy is derived after the fact — a
 * separate, optional step that can be skipped, lag behind an asynchronous save or die half
 * written. The consolidated files are still read: every tensor is compared by name, dtype and
 * shape with the sharded model, and any difference — or a copy that cannot be read at all — is a
 * warning, never a reason to refuse the step. Only when model/ holds no shards does the
 * consolidated copy back model/. */
#include "../io/place.h"
#include "safetensors.h"
#include "../util/text.h"
#include "torch_zip.h"

#include "../util/hashmap.h"
#include "../util/strbuf.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef enum { MODEL_NONE, MODEL_DCP_HF, MODEL_DCP, MODEL_PEFT, MODEL_CONSOLIDATED } model_kind;

static const char *const kind_names[] = {NULL, "dcp-hf shards", "dcp", "peft adapter",
                                         "consolidated safetensors"};

static bool is_file(const char *path) {
    return place_kind(path) == PLACE_FILE;
}

static bool is_dir(const char *path) {
    return place_kind(path) == PLACE_DIR;
}

/* dir + "/" + name into out; false when it does not fit. */
static bool join(char *out, size_t cap, const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    if (a + 1 + b >= cap) return false;
    memcpy(out, dir, a);
    out[a] = '/';
    memcpy(out + a + 1, name, b + 1);
    return true;
}

static bool has_entry(const char *dir, const char *name, bool want_dir) {
    char p[PATH_MAX];
    return join(p, sizeof p, dir, name) && (want_dir ? is_dir(p) : is_file(p));
}

static model_kind model_kind_of(const char *mdir) {
    char cons[PATH_MAX];
    if (has_entry(mdir, "adapter_model.safetensors", false)) return MODEL_PEFT;
    if (has_entry(mdir, ".metadata", false)) return MODEL_DCP;
    if (dcp_hf_probe(mdir)) return MODEL_DCP_HF;
    if (join(cons, sizeof cons, mdir, "consolidated") && hf_dir_probe(cons))
        return MODEL_CONSOLIDATED;
    return MODEL_NONE;
}

/* A step directory: model/ that holds a model, or optim/ that holds DCP state. */
static bool is_step_dir(const char *dir) {
    char p[PATH_MAX];
    if (has_entry(dir, ".metadata", false)) return false; /* a plain DCP checkpoint */
    if (join(p, sizeof p, dir, "model") && is_dir(p) && model_kind_of(p) != MODEL_NONE) return true;
    return join(p, sizeof p, dir, "optim") && dcp_probe(p);
}

/* model/ of a step mounted on its own: its own model plus the NeMo side directories. */
static bool is_model_dir(const char *dir) {
    char p[PATH_MAX];
    model_kind k = model_kind_of(dir);
    if (k == MODEL_NONE || k == MODEL_CONSOLIDATED || k == MODEL_PEFT) return false;
    return has_entry(dir, ".hf_metadata", true) ||
           (join(p, sizeof p, dir, "consolidated") && hf_dir_probe(p));
}

static bool is_adapter_dir(const char *dir) {
    return has_entry(dir, "adapter_model.safetensors", false) &&
           has_entry(dir, "adapter_config.json", false);
}

bool nemo_step_probe(const char *dir) {
    return is_step_dir(dir) || is_model_dir(dir) || is_adapter_dir(dir);
}

typedef struct nemo {
    ckpt_catalog *cat;
    ckpt_err *err;
    strbuf doc; /* members of the "nemo" document */
} nemo;

static char *keep(nemo *n, const char *s) {
    return arena_strdup(&n->cat->priv->mem, s);
}

/* Runs a directory decoder on `dir` as if it were the root, then moves what it added where the
 * step shows it: source and document names under rel_prefix, tensors under tensor_prefix. */
static int load_as_root(nemo *n, const char *dir, const char *rel_prefix, const char *tensor_prefix,
                        int (*load)(ckpt_catalog *, ckpt_err *)) {
    ckpt_catalog *cat = n->cat;
    uint32_t first_source = cat->nsources;
    size_t first_tensor = cat->ntensors, first_doc = cat->ndocs;
    char *root = cat->root;
    const char *format = cat->format;
    if (!(cat->root = keep(n, dir))) {
        cat->root = root;
        return ckpt_fail(n->err, -ENOMEM, "out of memory");
    }
    int rc = load(cat, n->err);
    cat->root = root;
    cat->format = format;
    char buf[PATH_MAX];
    for (uint32_t i = first_source; !rc && i < cat->nsources; i++) {
        snprintf(buf, sizeof buf, "%s%s", rel_prefix, cat->sources[i].relpath);
        if (!(cat->sources[i].relpath = keep(n, buf)))
            rc = ckpt_fail(n->err, -ENOMEM, "out of memory");
    }
    for (size_t i = first_doc; !rc && i < cat->ndocs; i++) {
        snprintf(buf, sizeof buf, "%s%s", rel_prefix, cat->docs[i].key);
        if (!(cat->docs[i].key = keep(n, buf))) rc = ckpt_fail(n->err, -ENOMEM, "out of memory");
    }
    for (size_t i = first_tensor; !rc && tensor_prefix && i < cat->ntensors; i++)
        rc = catalog_set_prefix(cat, i, tensor_prefix, false, n->err);
    return rc;
}

static bool aux_registered(const ckpt_catalog *cat, const char *name) {
    for (size_t i = 0; i < cat->naux; i++)
        if (strcmp(cat->aux[i].name, name) == 0) return true;
    return false;
}

/* Config and tokenizer files of dir not yet taken from a directory earlier in the order. */
static int add_aux_from(nemo *n, const char *dir, const char *rel_prefix) {
    for (size_t i = 0; i < ckpt_hf_aux_count; i++) {
        char path[PATH_MAX], rel[PATH_MAX];
        if (aux_registered(n->cat, ckpt_hf_aux_names[i]) ||
            !join(path, sizeof path, dir, ckpt_hf_aux_names[i]) || !is_file(path))
            continue;
        snprintf(rel, sizeof rel, "%s%s", rel_prefix, ckpt_hf_aux_names[i]);
        uint32_t src;
        int rc = catalog_add_source(n->cat, path, rel, &src, n->err);
        if (!rc) rc = catalog_add_aux(n->cat, ckpt_hf_aux_names[i], src, n->err);
        if (rc) return rc;
    }
    return 0;
}

static bool same_shape(const ckpt_tensor *t, const st_entry *e) {
    return t->dtype == e->dtype && t->ndim == e->ndim &&
           memcmp(t->shape, e->shape, e->ndim * sizeof *e->shape) == 0;
}

/* The consolidated copy beside a sharded model: read, compared, reported. It backs nothing, so
 * a copy that cannot be read is a warning, not a reason to refuse the step. */
static int check_consolidated(nemo *n, const char *cdir, const char *rel_prefix,
                              size_t first_tensor) {
    ckpt_catalog *cat = n->cat;
    char **names;
    size_t count;
    int rc = dirlist_files(cdir, ".safetensors", &names, &count);
    if (rc) return ckpt_fail(n->err, rc, "%s: %s", cdir, strerror(-rc));
    hashmap model;
    size_t nmodel = cat->ntensors - first_tensor;
    if (!hm_init(&model, nmodel)) rc = ckpt_fail(n->err, -ENOMEM, "out of memory");
    bool added;
    for (size_t i = first_tensor; !rc && i < cat->ntensors; i++)
        if (!hm_put(&model, cat->tensors[i].name, cat->tensors[i].name_len, i, &added))
            rc = ckpt_fail(n->err, -ENOMEM, "out of memory");
    size_t total = 0, matching = 0, differing = 0, extra = 0, warned = 0;
    bool *seen = calloc(nmodel ? nmodel : 1, sizeof *seen);
    if (!seen && !rc) rc = ckpt_fail(n->err, -ENOMEM, "out of memory");
    sb_puts(&n->doc, ",\n    \"consolidated\": {\"files\": [");
    ckpt_err why;
    bool unreadable = false;
    for (size_t f = 0; !rc && !unreadable && f < count; f++) {
        char path[PATH_MAX], rel[PATH_MAX];
        join(path, sizeof path, cdir, names[f]);
        snprintf(rel, sizeof rel, "%s%s", rel_prefix, names[f]);
        uint32_t src;
        st_header h;
        if (f) sb_puts(&n->doc, ", ");
        sb_json_str(&n->doc, rel, strlen(rel));
        if ((rc = catalog_add_source(cat, path, rel, &src, &why)) ||
            (rc = safetensors_read_header(cat, src, &h, &why))) {
            if (rc == -ENOMEM) {
                *n->err = why;
                break;
            }
            unreadable = true;
            rc = 0;
            break;
        }
        for (size_t i = 0; i < h.nentries; i++) {
            const st_entry *e = &h.entries[i];
            const hm_entry *he = hm_get(&model, e->name, e->name_len);
            total++;
            if (!he) {
                extra++;
                if (warned++ < 3)
                    catalog_warn(cat,
                                 "%s: \"%.*s\" is in the consolidated copy but not in the "
                                 "sharded model",
                                 rel, SHOWN_NAME(e->name, e->name_len));
                continue;
            }
            const ckpt_tensor *t = &cat->tensors[he->value];
            seen[he->value - first_tensor] = true;
            if (same_shape(t, e)) {
                matching++;
            } else {
                differing++;
                char cs[160], ms[160];
                if (warned++ < 3)
                    catalog_warn(cat,
                                 "%s: \"%.*s\" is %s[%s] in the consolidated copy but %s[%s] in "
                                 "the sharded model",
                                 rel, SHOWN_NAME(e->name, e->name_len),
                                 ckpt_dtype_info_of(e->dtype)->name,
                                 text_dims(cs, sizeof cs, e->shape, e->ndim),
                                 ckpt_dtype_info_of(t->dtype)->name,
                                 text_dims(ms, sizeof ms, t->shape, t->ndim));
            }
        }
        safetensors_header_free(&h);
    }
    if (!rc && unreadable) {
        catalog_warn(cat, "%s: the consolidated copy is not checked: %s", rel_prefix, why.msg);
        sb_puts(&n->doc, "], \"unreadable\": ");
        sb_json_str(&n->doc, why.msg, strlen(why.msg));
        sb_puts(&n->doc, ", \"backs_model\": false}");
        goto out;
    }
    size_t missing = 0;
    for (size_t i = 0; !rc && i < nmodel; i++) missing += !seen[i];
    if (!rc && (missing || differing || extra))
        catalog_warn(cat,
                     "%s: the consolidated copy differs from the sharded model that model/ shows "
                     "(tensors missing from it: %zu, with another dtype or shape: %zu, not in "
                     "the model: %zu)",
                     rel_prefix, missing, differing, extra);
    sb_printf(&n->doc,
              "], \"tensors\": %zu, \"matching\": %zu, \"differing\": %zu, \"missing\": %zu, "
              "\"extra\": %zu, \"backs_model\": false}",
              total, matching, differing, missing, extra);
out:
    free(seen);
    hm_free(&model);
    for (size_t i = 0; i < count; i++) free(names[i]);
    free(names);
    return rc;
}

/* The adapter_model.safetensors of a PEFT save, under `prefix` (NULL = the root). */
static int load_adapter(nemo *n, const char *mdir, const char *rel_prefix, const char *prefix) {
    ckpt_catalog *cat = n->cat;
    char path[PATH_MAX], rel[PATH_MAX];
    join(path, sizeof path, mdir, "adapter_model.safetensors");
    snprintf(rel, sizeof rel, "%sadapter_model.safetensors", rel_prefix);
    size_t first = cat->ntensors;
    uint32_t src;
    int rc = catalog_add_source(cat, path, rel, &src, n->err);
    if (!rc) rc = format_safetensors.load(cat, src, n->err);
    for (size_t i = first; !rc && prefix && i < cat->ntensors; i++)
        rc = catalog_set_prefix(cat, i, prefix, false, n->err);
    /* The file as it is, so that PEFT finds adapter_model.safetensors in the HF view. */
    if (!rc) rc = catalog_add_aux(cat, "adapter_model.safetensors", src, n->err);
    return rc;
}

/* The model of model directory mdir. */
static int load_model(nemo *n, const char *mdir, const char *rel_prefix, const char *prefix,
                      const char *adapter_prefix) {
    ckpt_catalog *cat = n->cat;
    model_kind kind = model_kind_of(mdir);
    char cdir[PATH_MAX], hdir[PATH_MAX], crel[PATH_MAX], hrel[PATH_MAX], key[PATH_MAX];
    if (!join(cdir, sizeof cdir, mdir, "consolidated") ||
        !join(hdir, sizeof hdir, mdir, ".hf_metadata"))
        return ckpt_fail(n->err, -ENAMETOOLONG, "%s: path too long", mdir);
    snprintf(crel, sizeof crel, "%sconsolidated/", rel_prefix);
    snprintf(hrel, sizeof hrel, "%s.hf_metadata/", rel_prefix);
    size_t first = cat->ntensors;
    int rc = 0;
    sb_puts(&n->doc, ",\n    \"model\": ");
    sb_json_str(&n->doc, kind_names[kind] ? kind_names[kind] : "none",
                strlen(kind_names[kind] ? kind_names[kind] : "none"));
    switch (kind) {
    case MODEL_DCP_HF:
        rc = load_as_root(n, mdir, rel_prefix, prefix, dcp_hf_load);
        break;
    case MODEL_DCP: {
        dcp_layout how = {prefix, false};
        snprintf(key, sizeof key, "%s.metadata", rel_prefix);
        rc = dcp_load_dir(cat, mdir, rel_prefix, *rel_prefix ? key : "dcp", &how, n->err);
        break;
    }
    case MODEL_PEFT:
        rc = load_adapter(n, mdir, rel_prefix, adapter_prefix);
        break;
    case MODEL_CONSOLIDATED:
        /* hf_dir_load also registers consolidated/'s config and tokenizer files. */
        rc = load_as_root(n, cdir, crel, prefix, hf_dir_load);
        if (!rc) sb_printf(&n->doc, ",\n    \"consolidated\": {\"backs_model\": true}");
        break;
    case MODEL_NONE:
        break;
    }
    if (rc) return rc;
    if (kind != MODEL_CONSOLIDATED && kind != MODEL_PEFT && hf_dir_probe(cdir))
        rc = check_consolidated(n, cdir, crel, first);
    if (!rc) rc = add_aux_from(n, hdir, hrel);
    if (!rc) rc = add_aux_from(n, cdir, crel);
    if (!rc) rc = add_aux_from(n, mdir, rel_prefix);
    return rc;
}

/* Training state NeMo keeps beside model/ and optim/: listed, and step_scheduler.pt's values
 * shown (a small torch.save dict: step, epoch ...). */
static bool not_model_or_optim(const struct place_entry *e, void *ctx) {
    (void)ctx;
    return strcmp(e->name, "model") != 0 && strcmp(e->name, "optim") != 0;
}

static int describe_other_files(nemo *n) {
    ckpt_catalog *cat = n->cat;
    char **names;
    size_t cnt;
    int rc = dirlist_names(cat->root, not_model_or_optim, NULL, &names, &cnt);
    if (rc && rc != -ENOMEM) return 0; /* an unreadable step directory: nothing to describe */
    sb_puts(&n->doc, ",\n    \"other_files\": [");
    for (size_t i = 0; !rc && i < cnt; i++) {
        char path[PATH_MAX], shown[NAME_MAX + 2];
        if (i) sb_puts(&n->doc, ", ");
        /* Directories end with '/', as ls -F shows them. */
        bool dir = join(path, sizeof path, cat->root, names[i]) && is_dir(path);
        int len = snprintf(shown, sizeof shown, "%s%s", names[i], dir ? "/" : "");
        sb_json_str(&n->doc, shown, len > 0 ? (size_t)len : 0);
    }
    sb_putc(&n->doc, ']');
    dirlist_free(names, cnt);
    if (rc) return ckpt_fail(n->err, rc, "%s: %s", cat->root, strerror(-rc));

    char path[PATH_MAX];
    if (!join(path, sizeof path, cat->root, "step_scheduler.pt") || !is_file(path)) return 0;
    uint32_t src;
    if ((rc = catalog_add_source(cat, path, "step_scheduler.pt", &src, n->err))) return rc;
    torch_embedded te;
    ckpt_err why;
    rc = torch_zip_read_embedded(cat, src, 0, cat->sources[src].size, cat->sources[src].path, "", 0,
                                 &te, &why);
    if (rc == -ENOMEM) {
        *n->err = why;
        return rc;
    }
    if (rc) {
        catalog_warn(cat, "step_scheduler.pt is not shown: %s", why.msg);
        return 0;
    }
    sb_puts(&n->doc, ",\n    \"step_scheduler\": {");
    sb_put(&n->doc, te.values, te.values_len);
    sb_putc(&n->doc, '}');
    torch_embedded_free(&te);
    return 0;
}

static int load_step(nemo *n) {
    ckpt_catalog *cat = n->cat;
    char mdir[PATH_MAX], odir[PATH_MAX];
    if (!join(mdir, sizeof mdir, cat->root, "model") ||
        !join(odir, sizeof odir, cat->root, "optim"))
        return ckpt_fail(n->err, -ENAMETOOLONG, "%s: path too long", cat->root);
    sb_puts(&n->doc, "\"layout\": \"step\"");
    int rc = 0;
    if (is_dir(mdir)) {
        rc = load_model(n, mdir, "model/", "model/", "adapter/");
    } else {
        sb_puts(&n->doc, ",\n    \"model\": null");
        catalog_warn(cat, "%s: no model/ directory: only the optimizer state is shown", cat->root);
    }
    if (!rc && dcp_probe(odir)) {
        dcp_layout how = {NULL, true};
        sb_puts(&n->doc, ",\n    \"optim\": \"optim/.metadata\"");
        rc = dcp_load_dir(cat, odir, "optim/", "optim/.metadata", &how, n->err);
    } else if (!rc) {
        sb_puts(&n->doc, ",\n    \"optim\": null");
    }
    if (!rc) rc = describe_other_files(n);
    return rc;
}

int nemo_step_load(ckpt_catalog *cat, ckpt_err *err) {
    nemo n = {cat, err, {0}};
    sb_init(&n.doc);
    int rc;
    if (is_step_dir(cat->root)) {
        rc = load_step(&n);
    } else if (is_model_dir(cat->root)) {
        sb_puts(&n.doc, "\"layout\": \"model directory\"");
        rc = load_model(&n, cat->root, "", NULL, NULL);
    } else {
        cat->format = "peft-adapter"; /* the row's name otherwise (open_dir) */
        sb_puts(&n.doc, "\"layout\": \"peft adapter\"");
        rc = load_model(&n, cat->root, "", NULL, NULL);
    }
    if (!rc) {
        strbuf doc;
        sb_init(&doc);
        sb_puts(&doc, "{\n    ");
        sb_put(&doc, n.doc.data, n.doc.len);
        sb_puts(&doc, "\n  }");
        rc = doc.failed || n.doc.failed ? ckpt_fail(err, -ENOMEM, "out of memory")
                                        : catalog_add_doc(cat, "nemo", doc.data, doc.len, err);
        sb_free(&doc);
    }
    sb_free(&n.doc);
    return rc;
}

const ckpt_format format_nemo_step = {
    .name = "nemo-automodel",
    .label = "NeMo Automodel step directory",
    .probe_dir = nemo_step_probe,
    .load_dir = nemo_step_load,
    .dir_looks_for = "NeMo step dirs model/ + optim/, PEFT adapter_model.safetensors",
};
