/* PyTorch DCP checkpoints saved with HuggingFace storage: a directory of safetensors files
 * (shard-0000R-model-0000i-of-0000N.safetensors) whose __metadata__.DCP_SHARDING_INFO maps each
 * tensor to the global origin ("saved_offsets") of the chunk the file holds. Every tensor is
 * shown once, with its full shape (per dimension the max of offset + chunk size), assembled
 * from its chunks by the extent planner. Like torch's reader, every *.safetensors file of the
 * directory is read; a file without DCP_SHARDING_INFO holds whole tensors (offsets 0). */
#include "safetensors.h"

#include "../util/hashmap.h"
#include "../util/pipeline.h"
#include "../util/strbuf.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static bool is_shard_name(const char *name) {
    unsigned r, i, n;
    int end = 0;
    return sscanf(name, "shard-%5u-model-%5u-of-%5u.safetensors%n", &r, &i, &n, &end) == 3 &&
           end > 0 && name[end] == '\0';
}

/* The sorted *.safetensors names of dir; *any_shard when one is named like a DCP shard. */
static int list_safetensors(const char *dir, char ***out, size_t *count, bool *any_shard) {
    int rc = dirlist_files(dir, ".safetensors", out, count);
    *any_shard = false;
    for (size_t i = 0; !rc && i < *count; i++) *any_shard |= is_shard_name((*out)[i]);
    return rc;
}

/* The directory holding the shards: DIR itself, or DIR/sharded (torch with consolidation). */
static bool shard_dir(const char *dir, char *out, size_t cap) {
    char **names;
    size_t n;
    bool any;
    for (int sub = 0; sub < 2; sub++) {
        int w = snprintf(out, cap, sub ? "%s/sharded" : "%s", dir);
        if (w < 0 || (size_t)w >= cap) return false;
        if (list_safetensors(out, &names, &n, &any) != 0) continue;
        dirlist_free(names, n);
        if (any) return true;
    }
    return false;
}

bool dcp_hf_probe(const char *dir) {
    char where[PATH_MAX];
    return shard_dir(dir, where, sizeof where);
}

typedef struct dcp_ctx {
    ckpt_catalog *cat;
    hashmap tensors;       /* name -> catalog tensor index */
    uint32_t first_source; /* of the rank files, in name order */
    ckpt_err *err;
} dcp_ctx;

/* The saved_offsets of one tensor from its DCP_SHARDING_INFO member t (NULL: none). */
static int chunk_origin(dcp_ctx *c, const ckpt_source *src, const json_value *info,
                        const json_value *t, const st_entry *e, uint64_t *origin) {
    memset(origin, 0, sizeof(uint64_t) * CKPT_MAX_DIMS);
    if (!info) return 0;
    if (!t)
        return ckpt_fail(c->err, -EINVAL,
                         "%s: tensor \"%.*s\" (header byte offset %zu) has no entry in "
                         "DCP_SHARDING_INFO",
                         src->path, SHOWN_NAME(e->name, e->name_len), 8 + (size_t)e->pos);
    const json_value *so = json_member(t, "saved_offsets");
    uint32_t k = 0;
    if (so && so->type == JSON_ARRAY && so->count == e->ndim)
        for (const json_value *v = so->head; v && json_as_u64(v, &origin[k]); v = v->next) k++;
    if (!so || so->type != JSON_ARRAY || so->count != e->ndim || k != e->ndim)
        return ckpt_fail(c->err, -EINVAL,
                         "%s: DCP_SHARDING_INFO of \"%.*s\": saved_offsets must be a list of %u "
                         "non-negative integer%s (one per dim)",
                         src->path, SHOWN_NAME(e->name, e->name_len), e->ndim,
                         e->ndim == 1 ? "" : "s");
    return 0;
}

static int add_chunk(dcp_ctx *c, uint32_t source, const st_entry *e, const uint64_t *origin) {
    ckpt_catalog *cat = c->cat;
    const ckpt_source *src = &cat->sources[source];
    uint64_t end[CKPT_MAX_DIMS], numel = 1;
    for (uint32_t d = 0; d < e->ndim; d++)
        if (__builtin_add_overflow(origin[d], e->shape[d], &end[d]) ||
            __builtin_mul_overflow(numel, end[d], &numel))
            return ckpt_fail(c->err, -EOVERFLOW,
                             "%s: DCP_SHARDING_INFO of \"%.*s\": saved_offsets + shape overflows "
                             "the tensor size on dim %u",
                             src->path, SHOWN_NAME(e->name, e->name_len), d);
    const hm_entry *h = hm_get(&c->tensors, e->name, e->name_len);
    size_t idx;
    if (!h) {
        int rc =
            catalog_add_tensor(cat, e->name, e->name_len, e->dtype, e->ndim, end, &idx, c->err);
        if (rc) return rc;
        bool added;
        const ckpt_tensor *t = &cat->tensors[idx];
        if (!hm_put(&c->tensors, t->name, t->name_len, idx, &added))
            return ckpt_fail(c->err, -ENOMEM, "out of memory");
    } else {
        idx = h->value;
        ckpt_tensor *t = &cat->tensors[idx];
        if (t->dtype != e->dtype || t->ndim != e->ndim)
            return ckpt_fail(c->err, -EINVAL,
                             "%s: tensor \"%.*s\" is %s with %u dims here but %s with %u dims in "
                             "another shard (dtype/dims mismatch)",
                             src->path, SHOWN_NAME(e->name, e->name_len),
                             ckpt_dtype_info_of(e->dtype)->name, e->ndim,
                             ckpt_dtype_info_of(t->dtype)->name, t->ndim);
        for (uint32_t d = 0; d < e->ndim; d++)
            if (end[d] > t->shape[d]) t->shape[d] = end[d];
    }
    return catalog_add_piece(cat, idx, source, e->offset, origin, e->shape, NULL, c->err);
}

/* metadata.json keeps each file's __metadata__ but only counts DCP_SHARDING_INFO's entries:
 * it repeats the header and can be megabytes. */
static int metadata_doc(dcp_ctx *c, uint32_t source, const st_header *h, const json_value *info) {
    if (!h->metadata || h->metadata->type != JSON_OBJECT) return 0;
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "{\"__metadata__\": {");
    bool first = true;
    for (const json_value *kv = h->metadata->head; kv; kv = kv->next) {
        if (!first) sb_puts(&sb, ", ");
        first = false;
        sb_json_str(&sb, kv->key, kv->key_len);
        sb_puts(&sb, ": ");
        if (info && kv->key_len == 17 && memcmp(kv->key, "DCP_SHARDING_INFO", 17) == 0)
            sb_printf(&sb, "\"<%u entries>\"", info->count);
        else
            sb_json_str(&sb, kv->str, kv->len);
    }
    sb_puts(&sb, "}}");
    int rc = sb.failed ? ckpt_fail(c->err, -ENOMEM, "out of memory")
                       : catalog_add_doc(c->cat, c->cat->sources[source].relpath, sb.data, sb.len,
                                         c->err);
    sb_free(&sb);
    return rc;
}

static int add_file(dcp_ctx *c, const char *dir, const char *rel_prefix, const char *name) {
    char path[PATH_MAX], rel[PATH_MAX];
    int w1 = snprintf(path, sizeof path, "%s/%s", dir, name);
    int w2 = snprintf(rel, sizeof rel, "%s%s", rel_prefix, name);
    if (w1 < 0 || w1 >= (int)sizeof path || w2 < 0 || w2 >= (int)sizeof rel)
        return ckpt_fail(c->err, -ENAMETOOLONG, "%s/%s: path too long", dir, name);
    uint32_t source;
    return catalog_add_source(c->cat, path, rel, &source, c->err);
}

/* One rank file, read and parsed ahead (pipeline.h): its header, its DCP_SHARDING_INFO and
 * each header entry's member of that info (NULL where it has none). */
typedef struct file_slot {
    st_header h;
    json_doc info_doc;
    const json_value *info;
    const json_value **member;
    ckpt_err err;
} file_slot;

static void file_slot_free(file_slot *f) {
    free(f->member);
    f->member = NULL;
    if (f->info) json_doc_free(&f->info_doc);
    safetensors_header_free(&f->h);
}

static bool same_name(const json_value *m, const st_entry *e) {
    return m->key_len == e->name_len && memcmp(m->key, e->name, e->name_len) == 0;
}

/* The writer lists the info in the order it wrote the tensors, which is the header's entries by
 * offset: walk both together, and index the info by name only when they part. */
static int match_members(file_slot *f) {
    size_t n = f->h.nentries;
    if (!(f->member = calloc(n ? n : 1, sizeof *f->member))) return -ENOMEM;
    const json_value *m = f->info->head;
    size_t k = 0;
    for (; k < n && m && same_name(m, &f->h.entries[k]); k++, m = m->next) f->member[k] = m;
    if (k == n) return 0;
    hashmap index;
    if (!hm_init(&index, f->info->count)) return -ENOMEM;
    bool added;
    for (m = f->info->head; m; m = m->next)
        if (!hm_put(&index, m->key, m->key_len, (size_t)m, &added)) {
            hm_free(&index);
            return -ENOMEM;
        }
    for (; k < n; k++) {
        const hm_entry *h = hm_get(&index, f->h.entries[k].name, f->h.entries[k].name_len);
        f->member[k] = h ? (const json_value *)h->value : NULL;
    }
    hm_free(&index);
    return 0;
}

static int read_file(void *ctx, size_t i, void *slot) {
    const dcp_ctx *c = ctx;
    file_slot *f = slot;
    const ckpt_catalog *cat = c->cat;
    uint32_t source = c->first_source + (uint32_t)i;
    int rc = safetensors_read_header(cat, source, &f->h, &f->err);
    if (rc) return rc;
    const char *path = cat->sources[source].path;
    const json_value *raw = json_member(f->h.metadata, "DCP_SHARDING_INFO");
    if (raw) {
        json_error jerr;
        if ((rc = json_parse(&f->info_doc, raw->str, raw->len, &jerr))) {
            rc = ckpt_fail(&f->err, rc, "%s: DCP_SHARDING_INFO is not valid JSON: %s (at %zu)",
                           path, jerr.msg, jerr.pos);
        } else {
            f->info = f->info_doc.root;
            if (f->info->type != JSON_OBJECT)
                rc =
                    ckpt_fail(&f->err, -EINVAL, "%s: DCP_SHARDING_INFO is not a JSON object", path);
        }
    }
    if (!rc && f->info && match_members(f) != 0) rc = ckpt_fail(&f->err, -ENOMEM, "out of memory");
    if (rc) file_slot_free(f);
    return rc;
}

static int add_file_chunks(void *ctx, size_t i, void *slot, int prepared) {
    dcp_ctx *c = ctx;
    file_slot *f = slot;
    if (prepared) {
        *c->err = f->err;
        return prepared;
    }
    uint32_t source = c->first_source + (uint32_t)i;
    const ckpt_source *src = &c->cat->sources[source];
    int rc = 0;
    for (size_t k = 0; !rc && k < f->h.nentries; k++) {
        uint64_t origin[CKPT_MAX_DIMS];
        rc = chunk_origin(c, src, f->info, f->info ? f->member[k] : NULL, &f->h.entries[k], origin);
        if (!rc) rc = add_chunk(c, source, &f->h.entries[k], origin);
    }
    if (!rc) rc = metadata_doc(c, source, &f->h, f->info);
    file_slot_free(f);
    return rc;
}

static void drop_file(void *ctx, size_t i, void *slot, int prepared) {
    (void)ctx, (void)i;
    if (!prepared) file_slot_free(slot);
}

/* A missing rank file can leave no hole (the shape just comes out smaller): say so. */
static void warn_rank_gaps(ckpt_catalog *cat, char **names, size_t n) {
    enum { MAX_TRACKED = 65536 };
    unsigned max = 0, distinct = 0;
    unsigned char *seen = calloc(MAX_TRACKED, 1);
    if (!seen) return;
    for (size_t i = 0; i < n; i++) {
        unsigned r, a, b;
        if (sscanf(names[i], "shard-%u-model-%u-of-%u", &r, &a, &b) == 3 && r < MAX_TRACKED) {
            distinct += !seen[r];
            seen[r] = 1;
            if (r > max) max = r;
        }
    }
    free(seen);
    if (distinct && distinct < max)
        catalog_warn(cat,
                     "shard files number ranks up to %u but only %u ranks are present: a "
                     "missing rank may have shrunk some tensors",
                     max, distinct);
}

int dcp_hf_load(ckpt_catalog *cat, ckpt_err *err) {
    char where[PATH_MAX];
    if (!shard_dir(cat->root, where, sizeof where))
        return ckpt_fail(err, -ENOENT, "%s: no DCP shard files (shard-*-model-*.safetensors)",
                         cat->root);
    const char *rel_prefix = strcmp(where, cat->root) == 0 ? "" : "sharded/";
    char **names;
    size_t n;
    bool any;
    int rc = list_safetensors(where, &names, &n, &any);
    if (rc) return ckpt_fail(err, rc, "%s: %s", where, strerror(-rc));
    dcp_ctx c = {.cat = cat, .err = err};
    if (!hm_init(&c.tensors, 1024)) rc = ckpt_fail(err, -ENOMEM, "out of memory");
    /* Every file is registered first: the sources must stay put while headers are read on
     * two threads. */
    c.first_source = cat->nsources;
    for (size_t i = 0; !rc && i < n; i++) rc = add_file(&c, where, rel_prefix, names[i]);
    static const ckpt_pipeline_ops file_ops = {read_file, add_file_chunks, drop_file};
    if (!rc) rc = ckpt_pipeline_run(n, sizeof(file_slot), 4, &file_ops, &c);
    warn_rank_gaps(cat, names, n);
    /* Shapes grew while chunks arrived: recompute sizes with overflow checks. */
    for (size_t i = 0; !rc && i < cat->ntensors; i++) {
        ckpt_tensor *t = &cat->tensors[i];
        if (!catalog_shape_nbytes(t->shape, t->ndim, t->dtype, &t->numel, &t->nbytes))
            rc = ckpt_fail(err, -EOVERFLOW,
                           "%s: tensor \"%.*s\": the shape its chunks' saved_offsets add up to "
                           "overflows",
                           cat->root, SHOWN_NAME(t->name, t->name_len));
    }
    hm_free(&c.tensors);
    dirlist_free(names, n);
    return rc;
}

const ckpt_format format_dcp_hf = {
    .name = "dcp-hf",
    .label = "DCP with Hugging Face storage",
    .probe_dir = dcp_hf_probe,
    .load_dir = dcp_hf_load,
    .dir_looks_for = "DCP shards shard-*-model-*.safetensors",
};
