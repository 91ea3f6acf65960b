/* PyTorch Distributed Checkpoint (DCP), native layout: a directory holding .metadata — a pickled
 * Metadata object — and the __R_N.distcp files its items live in.
 *
 * Metadata (torch 1.13: torch.distributed._shard.checkpoint.metadata; 2.x:
 * torch.distributed.checkpoint.metadata) is a dataclass pickled as NEWOBJ + BUILD(__dict__):
 *   state_dict_metadata  {fqn: TensorStorageMetadata(properties, size, chunks) |
 *                              BytesStorageMetadata()}
 *   storage_data         {MetadataIndex(fqn, offset): _StorageInfo(relative_path, offset, length)}
 *   planner_data, storage_meta (2.4+), version (~2.5+), and whatever later versions or other
 *   projects add (Megatron's mcore_data): unknown attributes are listed, never interpreted.
 * It is read with the restricted unpickler and a table of the DCP class names (both module
 * paths): nothing is imported or run, and any other global refuses the checkpoint by name.
 *
 * Each item is a byte range of a .distcp file holding an independent torch.save zip: for a
 * tensor chunk, that one chunk (possibly strided: the archive's stride and storage offset are
 * used as they are); for anything else (BYTE_IO), the saved value. A tensor is shown once, with
 * its global size, and assembled from its chunks — boxes given by ChunkStorageMetadata offsets
 * and sizes on any dimensions — by the extent planner. Chunks with identical boxes are replicas:
 * the first is used. Coverage is the planner's job: a hole makes the tensor incomplete (reads
 * there fail, the summary warns). Chunks are matched to storage entries by (fqn, offsets), never
 * by the index hint.
 *
 * Placement: optimizer state — keys starting with "optim." or "optimizer." (the prefix is
 * dropped), or "state." / "param_groups." (2.x flatten_optimizer_state_dict) — is shown under
 * optim/ and kept out of the model (HF view, totals); every other tensor is the model's. Values
 * that are not tensors go to metadata.json ("dcp" → "values"), keyed by fqn. torch 1.13 does not
 * flatten nested dicts: a nested state dict (typically the optimizer's) is one BYTE_IO item
 * holding a whole torch.save archive; its tensors are shown from inside it (dotted names under
 * the item's key), and an item that cannot be read is described and warned about, not fatal.
 *
 * Everything the pickle says is checked before use: relative paths stay inside the directory
 * (symlinks included), item ranges inside their files, chunk boxes inside their tensors, the
 * archive's dtype and shape equal to what .metadata declares. */
#include "../io/place.h"
#include "torch_zip.h"
#include "../util/text.h"
#include "../util/grow.h"

#include "../util/hashmap.h"
#include "../parse/pickle.h"
#include "../util/strbuf.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define METADATA_LIMIT (1ull << 30)
enum { MAX_PAIRWISE = 512, MAX_LISTED_CHUNKS = 1024, MAX_WARNED = 8, LABEL_MAX = PATH_MAX + 64 };

enum {
    T_METADATA = PK_G_USER,
    T_TENSOR_MD,
    T_CHUNK_MD,
    T_BYTES_MD,
    T_INDEX,
    T_PROPS,
    T_MEM_FORMAT,
    T_STORAGE_INFO,
    T_STORAGE_META,
    T_PATH,
    T_GETATTR,
};

#define C(m, n, tag)                                                                               \
    { m, n, tag, -1, 0, NULL }
#define OLD_CK "torch.distributed._shard.checkpoint.metadata"
#define OLD_ST "torch.distributed._shard.sharded_tensor.metadata"
#define NEW_CK "torch.distributed.checkpoint.metadata"

/* Class paths of torch 1.13 (torch.distributed._shard.*) and 2.x (torch.distributed.checkpoint,
 * TensorProperties moved there in 2.3), the enum helper Python >= 3.11 pickles members with, and
 * pathlib paths (StorageMeta.checkpoint_id). Data-only classes: nothing here is ever called. */
static const pk_global dcp_globals[] = {
    C(OLD_CK, "Metadata", T_METADATA),
    C(NEW_CK, "Metadata", T_METADATA),
    C(OLD_CK, "TensorStorageMetadata", T_TENSOR_MD),
    C(NEW_CK, "TensorStorageMetadata", T_TENSOR_MD),
    C(OLD_CK, "ChunkStorageMetadata", T_CHUNK_MD),
    C(NEW_CK, "ChunkStorageMetadata", T_CHUNK_MD),
    C(OLD_CK, "BytesStorageMetadata", T_BYTES_MD),
    C(NEW_CK, "BytesStorageMetadata", T_BYTES_MD),
    C(OLD_CK, "MetadataIndex", T_INDEX),
    C(NEW_CK, "MetadataIndex", T_INDEX),
    C(OLD_ST, "TensorProperties", T_PROPS),
    C(NEW_CK, "TensorProperties", T_PROPS),
    C(OLD_ST, "MEM_FORMAT_ENCODING", T_MEM_FORMAT),
    C(NEW_CK, "MEM_FORMAT_ENCODING", T_MEM_FORMAT),
    C(NEW_CK, "_MEM_FORMAT_ENCODING", T_MEM_FORMAT),
    C("torch.distributed._shard.checkpoint.filesystem", "_StorageInfo", T_STORAGE_INFO),
    C("torch.distributed.checkpoint.filesystem", "_StorageInfo", T_STORAGE_INFO),
    C(NEW_CK, "StorageMeta", T_STORAGE_META),
    C("builtins", "getattr", T_GETATTR),
    C("pathlib", "PosixPath", T_PATH),
    C("pathlib", "WindowsPath", T_PATH),
    C("pathlib", "PurePosixPath", T_PATH),
    C("pathlib", "PureWindowsPath", T_PATH),
    C("pathlib", "Path", T_PATH),
    C("pathlib._local", "PosixPath", T_PATH),
    C("pathlib._local", "WindowsPath", T_PATH),
    C("pathlib._local", "PurePosixPath", T_PATH),
    C("pathlib._local", "PureWindowsPath", T_PATH),
};

static const pk_table dcp_table = {dcp_globals, sizeof dcp_globals / sizeof *dcp_globals};

/* One storage_data entry: where an item's torch.save archive lives. */
typedef struct item {
    uint32_t file; /* index in dcp.files */
    uint64_t offset, length;
    const pk_value *transforms; /* a non-empty transform_descriptors list, or NULL */
    bool used;
} item;

typedef struct distcp_file {
    uint32_t source;
    const char *rel; /* relative_path as written (points into the pickle) */
    size_t rel_len;
    size_t items;
} distcp_file;

typedef struct dcp {
    ckpt_catalog *cat;
    ckpt_err *err;
    const dcp_layout *how;
    const char *dir, *rel_prefix, *path; /* path: of .metadata, for messages */
    char real[PATH_MAX];                 /* the directory after symlinks */
    arena mem;                           /* storage keys, labels */
    hashmap file_by_name;
    distcp_file *files;
    size_t nfiles, cap_files;
    hashmap item_by_key;
    item *items;
    size_t nitems;
    strbuf values; /* members of "values" */
    size_t nvalues;
    bool values_full;  /* "values" reached CKPT_DOC_LIMIT: later ones are left out */
    pk_value *dropped; /* stands for every planner_data value (only their number is shown) */
    size_t ntensors, nbytes_items, nchunks, nreplicas, nblob_tensors, nunreadable, nwarned;
} dcp;

#define POS(v) ((unsigned long long)(v)->pos)

/* ---- compact records of entries read while the pickle is parsed ---- */

enum { REC_TENSOR = 1, REC_STORAGE, REC_DROPPED };

/* A checked TensorStorageMetadata: v holds size[ndim], then per chunk its position, offsets
 * and sizes. */
typedef struct tensor_rec {
    ckpt_dtype dt;
    bool requires_grad;
    uint32_t ndim, n;
    uint64_t v[];
} tensor_rec;

/* A storage_data pair read as far as it can be without the file system. */
typedef struct storage_rec {
    const char *fqn, *rp; /* in the pickle buffer */
    size_t fqn_len, rp_len;
    uint64_t index_pos, info_pos, rp_pos, offset, length;
    uint32_t n;
    bool has_offsets;
    uint64_t offsets[];
} storage_rec;

static bool is_rec(const pk_value *v, uint32_t tag) {
    return v && v->kind == PK_RECORD && v->n == tag;
}

/* ---- reading the object graph ---- */

static bool is_obj(const pk_value *v, int tag) {
    const pk_global *g = pk_call_global(v);
    return g && g->tag == tag;
}

/* An attribute of a pickled dataclass: BUILD state is its __dict__, or (__dict__, slots). */
static const pk_value *attr(const pk_value *obj, const char *name) {
    if (!obj || obj->kind != PK_CALL || !obj->u.call.state) return NULL;
    const pk_value *st = obj->u.call.state;
    if (st->kind == PK_DICT) return pk_dict_get(st, name);
    if (st->kind == PK_TUPLE && st->n == 2) {
        const pk_value *v = NULL;
        for (uint32_t i = 0; i < 2 && !v; i++)
            if (st->u.c.items[i]->kind == PK_DICT) v = pk_dict_get(st->u.c.items[i], name);
        return v;
    }
    return NULL;
}

static const char *kind_of(const pk_value *v, char *buf, size_t size) {
    const pk_global *g = pk_call_global(v);
    if (g) return pk_global_name(g, buf, size);
    if (v && v->kind == PK_GLOBAL) return pk_global_name(v->u.global, buf, size);
    return v ? pk_kind_name((pk_kind)v->kind) : "nothing";
}

/* Why v is not a usable count or offset. */
static const char *not_u64(const pk_value *v) {
    if (v->kind == PK_INT) return "negative";
    if (v->kind == PK_BIGINT) return "an integer beyond 64 bits";
    return pk_kind_name((pk_kind)v->kind);
}

/* A torch.Size, tuple or list of non-negative ints. */
static int read_dims(dcp *d, const pk_value *v, const char *what, const char *fqn, size_t fqn_len,
                     uint32_t *n, uint64_t *out) {
    char kb[160];
    const pk_value *t = v;
    if (t && is_obj(t, PK_G_SIZE) && t->u.call.args->n == 1) t = t->u.call.args->u.c.items[0];
    if (!t || (t->kind != PK_TUPLE && t->kind != PK_LIST))
        return ckpt_fail(d->err, -EINVAL, "%s: %s of \"%.*s\" at offset %llu is a %s, not a size",
                         d->path, what, SHOWN_NAME(fqn, fqn_len), v ? POS(v) : 0ull,
                         kind_of(v, kb, sizeof kb));
    if (t->n > CKPT_MAX_DIMS)
        return ckpt_fail(d->err, -EINVAL,
                         "%s: %s of \"%.*s\" at offset %llu has %u dimensions (at most %d)",
                         d->path, what, SHOWN_NAME(fqn, fqn_len), POS(t), t->n, CKPT_MAX_DIMS);
    for (uint32_t i = 0; i < t->n; i++) {
        const pk_value *x = t->u.c.items[i];
        if (x->kind != PK_INT || x->u.i < 0)
            return ckpt_fail(d->err, -EINVAL,
                             "%s: %s of \"%.*s\" at offset %llu: entry %u is %s, not a "
                             "non-negative int",
                             d->path, what, SHOWN_NAME(fqn, fqn_len), POS(x), i, not_u64(x));
        out[i] = (uint64_t)x->u.i;
    }
    *n = t->n;
    return 0;
}

static int read_u64(dcp *d, const pk_value *v, const char *what, const char *fqn, size_t fqn_len,
                    const pk_value *owner, uint64_t *out) {
    if (!v || v->kind != PK_INT || v->u.i < 0)
        return ckpt_fail(d->err, -EINVAL,
                         "%s: %s of the storage entry of \"%.*s\" at offset %llu is %s, not a "
                         "non-negative int",
                         d->path, what, SHOWN_NAME(fqn, fqn_len), POS(v ? v : owner),
                         v ? not_u64(v) : "missing");
    *out = (uint64_t)v->u.i;
    return 0;
}

static void put_dims(strbuf *sb, const uint64_t *v, uint32_t n) {
    sb_putc(sb, '[');
    for (uint32_t i = 0; i < n; i++) {
        if (i) sb_puts(sb, ", ");
        sb_u64(sb, v[i]);
    }
    sb_putc(sb, ']');
}

/* ---- storage_data: item locations ---- */

/* A map key for (fqn, chunk offsets): fqn, then 0xFF and the offsets, or 0xFE for no offsets
 * (BYTE_IO items). */
static char *item_key(dcp *d, const char *fqn, size_t fqn_len, const uint64_t *off, uint32_t n,
                      bool has_offsets, size_t *len) {
    *len = fqn_len + 1 + (has_offsets ? 8 * (size_t)n : 0);
    char *k = arena_alloc(&d->mem, *len);
    if (!k) return NULL;
    memcpy(k, fqn, fqn_len);
    k[fqn_len] = (char)(has_offsets ? 0xFF : 0xFE);
    for (uint32_t i = 0; has_offsets && i < n; i++)
        for (int b = 0; b < 8; b++) k[fqn_len + 1 + 8 * i + b] = (char)(off[i] >> (8 * b));
    return k;
}

/* relative_path: a plain relative name inside the directory, also after symlinks. */
static int open_path(dcp *d, const char *s, size_t n, uint64_t rp_pos, uint32_t *index) {
    const hm_entry *he = hm_get(&d->file_by_name, s, n);
    if (he) {
        *index = (uint32_t)he->value;
        return 0;
    }
    bool bad = n == 0 || n > 1024 || s[0] == '/' || memchr(s, '\0', n);
    for (size_t b = 0, i = 0; !bad && i <= n; i++) {
        if (i == n || s[i] == '/') {
            if (i - b == 2 && s[b] == '.' && s[b + 1] == '.') bad = true;
            b = i + 1;
        }
    }
    if (bad)
        return ckpt_fail(d->err, -EINVAL,
                         "%s: relative_path \"%.*s\" at offset %llu is not a file name inside the "
                         "checkpoint directory",
                         d->path, SHOWN_NAME(s, n), (unsigned long long)rp_pos);
    char path[PATH_MAX], real[PATH_MAX], rel[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%.*s", d->dir, (int)n, s) >= (int)sizeof path ||
        snprintf(rel, sizeof rel, "%s%.*s", d->rel_prefix, (int)n, s) >= (int)sizeof rel)
        return ckpt_fail(d->err, -ENAMETOOLONG, "%s: relative_path at offset %llu is too long",
                         d->path, (unsigned long long)rp_pos);
    int prc = place_resolve(path, real), kind = prc ? PLACE_MISSING : place_kind(real);
    if (kind == PLACE_MISSING) {
        int e = prc ? -prc : ENOENT;
        return ckpt_fail(d->err, -ENOENT,
                         "%s: relative_path \"%.*s\" at offset %llu names a file that cannot be "
                         "opened (%s)",
                         d->path, SHOWN_NAME(s, n), (unsigned long long)rp_pos, strerror(e));
    }
    size_t rl = strlen(d->real);
    if (strncmp(real, d->real, rl) != 0 || real[rl] != '/')
        return ckpt_fail(d->err, -EINVAL,
                         "%s: relative_path \"%.*s\" at offset %llu resolves outside the "
                         "checkpoint directory (to %s)",
                         d->path, SHOWN_NAME(s, n), (unsigned long long)rp_pos, real);
    if (kind != PLACE_FILE)
        return ckpt_fail(d->err, -EINVAL,
                         "%s: relative_path \"%.*s\" at offset %llu is not a regular file", d->path,
                         SHOWN_NAME(s, n), (unsigned long long)rp_pos);
    uint32_t src;
    int rc = catalog_add_source(d->cat, path, rel, &src, d->err);
    if (rc) return rc;
    if (GROW(d->files, d->cap_files, d->nfiles + 1))
        return ckpt_fail(d->err, -ENOMEM, "out of memory");
    d->files[d->nfiles] = (distcp_file){src, s, n, 0};
    bool added;
    if (!hm_put(&d->file_by_name, s, n, d->nfiles, &added))
        return ckpt_fail(d->err, -ENOMEM, "out of memory");
    *index = (uint32_t)d->nfiles++;
    return 0;
}

/* A storage_data pair as far as it is read without the file system. */
typedef struct storage_fields {
    const char *fqn;
    size_t fqn_len;
    uint64_t index_pos, info_pos, offset, length;
    uint32_t n;
    bool has_offsets;
    uint64_t offsets[CKPT_MAX_DIMS];
} storage_fields;

static int read_storage_head(dcp *d, const pk_value *index, const pk_value *info,
                             storage_fields *f) {
    char kb[160];
    if (!is_obj(index, T_INDEX))
        return ckpt_fail(d->err, -EINVAL,
                         "%s: storage_data key at offset %llu is a %s, not a MetadataIndex",
                         d->path, POS(index), kind_of(index, kb, sizeof kb));
    const pk_value *fqn = attr(index, "fqn");
    if (!fqn || fqn->kind != PK_STR)
        return ckpt_fail(d->err, -EINVAL,
                         "%s: MetadataIndex at offset %llu has no string fqn (it is %s)", d->path,
                         POS(index), fqn ? kind_of(fqn, kb, sizeof kb) : "missing");
    const char *name = fqn->u.s.p;
    size_t name_len = fqn->u.s.len;
    if (!is_obj(info, T_STORAGE_INFO))
        return ckpt_fail(d->err, -EINVAL,
                         "%s: storage_data value of \"%.*s\" at offset %llu is a %s, not a "
                         "_StorageInfo",
                         d->path, SHOWN_NAME(name, name_len), POS(info),
                         kind_of(info, kb, sizeof kb));
    memset(f, 0, sizeof *f);
    f->fqn = name;
    f->fqn_len = name_len;
    f->index_pos = index->pos;
    f->info_pos = info->pos;
    const pk_value *off = attr(index, "offset");
    f->has_offsets = off && off->kind != PK_NONE;
    int rc = f->has_offsets
                 ? read_dims(d, off, "MetadataIndex offset", name, name_len, &f->n, f->offsets)
                 : 0;
    if (!rc) rc = read_u64(d, attr(info, "offset"), "offset", name, name_len, info, &f->offset);
    if (!rc) rc = read_u64(d, attr(info, "length"), "length", name, name_len, info, &f->length);
    return rc;
}

/* rec: the pair as a storage_rec (index and info are then NULL), or NULL. */
static int read_storage_entry(dcp *d, const pk_value *index, const pk_value *info,
                              const storage_rec *rec) {
    char kb[160];
    storage_fields f;
    int rc = 0;
    if (rec) {
        memset(&f, 0, sizeof f);
        f.fqn = rec->fqn;
        f.fqn_len = rec->fqn_len;
        f.index_pos = rec->index_pos;
        f.info_pos = rec->info_pos;
        f.offset = rec->offset;
        f.length = rec->length;
        f.n = rec->n;
        f.has_offsets = rec->has_offsets;
        memcpy(f.offsets, rec->offsets, rec->n * sizeof *f.offsets);
    } else if ((rc = read_storage_head(d, index, info, &f))) {
        return rc;
    }
    const char *name = f.fqn;
    size_t name_len = f.fqn_len;
    item *it = &d->items[d->nitems];
    memset(it, 0, sizeof *it);
    it->offset = f.offset;
    it->length = f.length;
    if (rec) {
        rc = open_path(d, rec->rp, rec->rp_len, rec->rp_pos, &it->file);
    } else {
        const pk_value *rp = attr(info, "relative_path");
        if (!rp || rp->kind != PK_STR)
            return ckpt_fail(d->err, -EINVAL,
                             "%s: relative_path of the storage entry at offset %llu is %s, not a "
                             "string",
                             d->path, POS(rp ? rp : info),
                             rp ? kind_of(rp, kb, sizeof kb) : "missing");
        rc = open_path(d, rp->u.s.p, rp->u.s.len, rp->pos, &it->file);
    }
    if (rc) return rc;
    const ckpt_source *src = &d->cat->sources[d->files[it->file].source];
    uint64_t end;
    if (__builtin_add_overflow(it->offset, it->length, &end) || end > src->size)
        return ckpt_fail(d->err, -EINVAL,
                         "%s: storage entry of \"%.*s\" at offset %llu: offset %llu + length %llu "
                         "runs past the end of %s (size %llu)",
                         d->path, SHOWN_NAME(name, name_len), (unsigned long long)f.info_pos,
                         (unsigned long long)it->offset, (unsigned long long)it->length,
                         src->relpath, (unsigned long long)src->size);
    const pk_value *tr = rec ? NULL : attr(info, "transform_descriptors");
    if (tr && tr->kind != PK_NONE) {
        if (tr->kind != PK_LIST && tr->kind != PK_TUPLE)
            return ckpt_fail(d->err, -EINVAL,
                             "%s: transform_descriptors of \"%.*s\" at offset %llu is a %s, not a "
                             "list",
                             d->path, SHOWN_NAME(name, name_len), POS(tr),
                             kind_of(tr, kb, sizeof kb));
        if (tr->n) it->transforms = tr;
    }
    size_t klen;
    char *key = item_key(d, name, name_len, f.offsets, f.n, f.has_offsets, &klen);
    bool added;
    if (!key || !hm_put(&d->item_by_key, key, klen, d->nitems, &added))
        return ckpt_fail(d->err, -ENOMEM, "out of memory");
    if (!added)
        return ckpt_fail(d->err, -EINVAL,
                         "%s: storage_data lists \"%.*s\" with these offsets twice (second entry "
                         "at offset %llu)",
                         d->path, SHOWN_NAME(name, name_len), (unsigned long long)f.index_pos);
    d->files[it->file].items++;
    d->nitems++;
    return 0;
}

static int read_storage_data(dcp *d, const pk_value *sd) {
    char kb[160];
    if (!sd || sd->kind != PK_DICT)
        return ckpt_fail(d->err, -EINVAL,
                         "%s: storage_data of the Metadata object is %s, not a dict", d->path,
                         sd ? kind_of(sd, kb, sizeof kb) : "missing");
    d->items = calloc(sd->n ? sd->n : 1, sizeof *d->items);
    if (!d->items || !hm_init(&d->item_by_key, sd->n) || !hm_init(&d->file_by_name, 64))
        return ckpt_fail(d->err, -ENOMEM, "out of memory");
    for (uint32_t i = 0; i < sd->n; i++) {
        const pk_value *k = sd->u.c.items[2 * i];
        int rc = is_rec(k, REC_STORAGE) ? read_storage_entry(d, NULL, NULL, k->u.record)
                                        : read_storage_entry(d, k, sd->u.c.items[2 * i + 1], NULL);
        if (rc) return rc;
    }
    return 0;
}

static item *find_item(dcp *d, const char *fqn, size_t fqn_len, const uint64_t *off, uint32_t n,
                       bool has_offsets) {
    size_t klen;
    char *key = item_key(d, fqn, fqn_len, off, n, has_offsets, &klen);
    const hm_entry *he = key ? hm_get(&d->item_by_key, key, klen) : NULL;
    return he ? &d->items[he->value] : NULL;
}

/* "dir/__0_0.distcp [offset 862]": names one item in messages. Written into the caller's
 * buffer: one kept per chunk would add up to megabytes. */
static const char *item_label(dcp *d, const item *it, char *buf, size_t size) {
    const ckpt_source *src = &d->cat->sources[d->files[it->file].source];
    snprintf(buf, size, "%s [item at offset %llu, %llu bytes]", src->path,
             (unsigned long long)it->offset, (unsigned long long)it->length);
    return buf;
}

/* ---- where a key is shown ---- */

static bool starts_with(const char *s, size_t n, const char *p) {
    size_t m = strlen(p);
    return n >= m && memcmp(s, p, m) == 0;
}

/* Optimizer state goes under optim/ (aside); everything else is the model. */
static void place(const dcp *d, const char *fqn, size_t len, const char **name, size_t *name_len,
                  const char **prefix, bool *aside) {
    *name = fqn;
    *name_len = len;
    bool optim = d->how && d->how->all_optim;
    static const char *const strip[] = {"optim.", "optimizer."};
    for (size_t i = 0; i < 2; i++) {
        if (starts_with(fqn, len, strip[i]) && len > strlen(strip[i])) {
            *name = fqn + strlen(strip[i]);
            *name_len = len - strlen(strip[i]);
            optim = true;
        }
    }
    if (starts_with(fqn, len, "state.") || starts_with(fqn, len, "param_groups.")) optim = true;
    if (optim) {
        *prefix = "optim/";
        *aside = true;
    } else {
        *prefix = d->how ? d->how->model_prefix : NULL;
        *aside = false;
    }
}

static int add_placed_tensor(dcp *d, const char *fqn, size_t len, ckpt_dtype dt, uint32_t ndim,
                             const uint64_t *shape, size_t *index) {
    const char *name, *prefix;
    size_t name_len;
    bool aside;
    place(d, fqn, len, &name, &name_len, &prefix, &aside);
    int rc = catalog_add_tensor(d->cat, name, name_len, dt, ndim, shape, index, d->err);
    if (!rc && prefix) rc = catalog_set_prefix(d->cat, *index, prefix, aside, d->err);
    return rc;
}

static void warn_limited(dcp *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warn_limited(dcp *d, const char *fmt, ...) {
    if (d->nwarned++ >= MAX_WARNED) return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    catalog_warn(d->cat, "%s", buf);
}

/* ---- tensors ---- */

typedef struct chunk {
    uint64_t pos; /* of its ChunkStorageMetadata, for messages */
    uint64_t offsets[CKPT_MAX_DIMS], sizes[CKPT_MAX_DIMS];
} chunk;

static int chunk_cmp(const void *a, const void *b) {
    const chunk *x = *(const chunk *const *)a, *y = *(const chunk *const *)b;
    for (uint32_t i = 0; i < CKPT_MAX_DIMS; i++)
        if (x->offsets[i] != y->offsets[i]) return x->offsets[i] < y->offsets[i] ? -1 : 1;
    return 0;
}

static bool boxes_overlap(const chunk *a, const chunk *b, uint32_t ndim) {
    for (uint32_t i = 0; i < ndim; i++) {
        if (!a->sizes[i] || !b->sizes[i]) return false;
        if (a->offsets[i] + a->sizes[i] <= b->offsets[i] ||
            b->offsets[i] + b->sizes[i] <= a->offsets[i])
            return false;
    }
    return true;
}

static bool same_box(const chunk *a, const chunk *b, uint32_t ndim) {
    return memcmp(a->offsets, b->offsets, ndim * sizeof(uint64_t)) == 0 &&
           memcmp(a->sizes, b->sizes, ndim * sizeof(uint64_t)) == 0;
}

static int read_properties(dcp *d, const pk_value *md, const char *fqn, size_t len, ckpt_dtype *dt,
                           bool *requires_grad) {
    char kb[160];
    const pk_value *props = attr(md, "properties");
    if (!is_obj(props, T_PROPS))
        return ckpt_fail(d->err, -EINVAL,
                         "%s: properties of \"%.*s\" at offset %llu is %s, not a TensorProperties",
                         d->path, SHOWN_NAME(fqn, len), POS(props ? props : md),
                         props ? kind_of(props, kb, sizeof kb) : "missing");
    /* __getstate__ gives (dtype, layout, requires_grad, memory_format, pin_memory[, strides]);
     * a plain __dict__ state is accepted too. */
    const pk_value *st = props->u.call.state, *dtype = NULL, *rg = NULL;
    if (st && st->kind == PK_TUPLE && st->n >= 5) {
        dtype = st->u.c.items[0];
        rg = st->u.c.items[2];
    } else if (st && st->kind == PK_DICT) {
        dtype = pk_dict_get(st, "dtype");
        rg = pk_dict_get(st, "requires_grad");
    } else {
        return ckpt_fail(
            d->err, -EINVAL,
            "%s: TensorProperties of \"%.*s\" at offset %llu: state is %s, not a "
            "tuple of at least 5 items",
            d->path, SHOWN_NAME(fqn, len), POS(props),
            st ? (st->kind == PK_TUPLE ? "a shorter tuple" : pk_kind_name((pk_kind)st->kind))
               : "missing");
    }
    if (!dtype || dtype->kind != PK_GLOBAL || dtype->u.global->tag != PK_G_DTYPE)
        return ckpt_fail(d->err, -EINVAL,
                         "%s: dtype of \"%.*s\" at offset %llu is %s, not a torch dtype", d->path,
                         SHOWN_NAME(fqn, len), POS(dtype ? dtype : props),
                         dtype ? kind_of(dtype, kb, sizeof kb) : "missing");
    if (dtype->u.global->dtype < 0)
        return ckpt_fail(d->err, -ENOTSUP,
                         "%s: dtype %s of \"%.*s\" at offset %llu is not "
                         "supported (%s)",
                         d->path, pk_global_name(dtype->u.global, kb, sizeof kb),
                         SHOWN_NAME(fqn, len), POS(dtype),
                         dtype->u.global->note ? dtype->u.global->note : "no dtype");
    *dt = (ckpt_dtype)dtype->u.global->dtype;
    *requires_grad = rg && rg->kind == PK_BOOL && rg->u.b;
    return 0;
}

static void put_chunk_json(dcp *d, strbuf *sb, const item *it, const chunk *c, uint32_t ndim) {
    const distcp_file *f = &d->files[it->file];
    sb_puts(sb, "{\"file\": ");
    sb_json_str(sb, d->cat->sources[f->source].relpath, strlen(d->cat->sources[f->source].relpath));
    sb_puts(sb, ", \"offset\": ");
    sb_u64(sb, it->offset);
    sb_puts(sb, ", \"length\": ");
    sb_u64(sb, it->length);
    sb_puts(sb, ", \"offsets\": ");
    put_dims(sb, c->offsets, ndim);
    sb_puts(sb, ", \"sizes\": ");
    put_dims(sb, c->sizes, ndim);
}

/* Reads one chunk's archive and adds its piece. */
static int add_chunk(dcp *d, size_t index, const char *fqn, size_t len, ckpt_dtype dt,
                     uint32_t ndim, uint32_t k, const chunk *c, strbuf *chunks_json) {
    char ob[200];
    item *it = find_item(d, fqn, len, c->offsets, ndim, true);
    if (!it)
        return ckpt_fail(d->err, -EINVAL,
                         "%s: chunk %u of \"%.*s\" at offset %llu (offsets [%s]) has no "
                         "storage_data entry",
                         d->path, k, SHOWN_NAME(fqn, len), (unsigned long long)c->pos,
                         text_dims(ob, sizeof ob, c->offsets, ndim));
    it->used = true;
    put_chunk_json(d, chunks_json, it, c, ndim);
    if (it->transforms) {
        size_t budget = 256;
        sb_puts(chunks_json, ", \"transforms\": ");
        pk_to_json_within(chunks_json, it->transforms, &budget, 4096, NULL); /* per chunk */
        sb_putc(chunks_json, '}');
        warn_limited(d,
                     "%s: chunk %u of \"%.*s\" is stored through transform_descriptors "
                     "(compression or other extensions), which ckptfs cannot undo: that region "
                     "is missing",
                     d->path, k, SHOWN_NAME(fqn, len));
        return 0;
    }
    char label_buf[LABEL_MAX];
    const char *label = item_label(d, it, label_buf, sizeof label_buf);
    torch_embedded e;
    int rc = torch_zip_read_embedded(d->cat, d->files[it->file].source, it->offset, it->length,
                                     label, fqn, len, &e, d->err);
    if (rc) return rc;
    const torch_embedded_tensor *t = e.ntensors == 1 ? &e.tensors[0] : NULL;
    char want[200], got[200];
    if (!t || t->name_len != len || e.nvalues)
        rc = ckpt_fail(d->err, -EINVAL,
                       "%s: chunk %u of \"%.*s\": the archive holds %zu tensors and %zu other "
                       "values, not exactly one tensor saved on its own",
                       label, k, SHOWN_NAME(fqn, len), e.ntensors, e.nvalues);
    else if (t->dtype != dt)
        rc = ckpt_fail(d->err, -EINVAL,
                       "%s: chunk %u of \"%.*s\": the archive's tensor at offset %llu is %s but "
                       ".metadata says %s",
                       label, k, SHOWN_NAME(fqn, len), (unsigned long long)t->pos,
                       ckpt_dtype_info_of(t->dtype)->name, ckpt_dtype_info_of(dt)->name);
    else if (t->ndim != ndim || memcmp(t->shape, c->sizes, ndim * sizeof(uint64_t)) != 0)
        rc = ckpt_fail(d->err, -EINVAL,
                       "%s: chunk %u of \"%.*s\": the archive's tensor at offset %llu has shape "
                       "[%s] but the chunk's sizes are [%s]",
                       label, k, SHOWN_NAME(fqn, len), (unsigned long long)t->pos,
                       text_dims(got, sizeof got, t->shape, t->ndim),
                       text_dims(want, sizeof want, c->sizes, ndim));
    if (!rc) {
        rc = catalog_add_piece(d->cat, index, d->files[it->file].source, t->file_offset, c->offsets,
                               c->sizes, t->row_major ? NULL : t->stride, d->err);
        sb_puts(chunks_json, ", \"data_offset\": ");
        sb_u64(chunks_json, t->file_offset);
        if (!t->row_major) {
            sb_puts(chunks_json, ", \"stride\": ");
            put_dims(chunks_json, t->stride, ndim);
        }
        sb_putc(chunks_json, '}');
    }
    torch_embedded_free(&e);
    return rc;
}

static int read_chunks(dcp *d, const pk_value *list, const char *fqn, size_t len, uint32_t ndim,
                       const uint64_t *size, chunk **out, uint32_t *count) {
    char kb[160], ob[200], sb[200], zb[200];
    *out = NULL;
    *count = 0;
    if (!list || (list->kind != PK_LIST && list->kind != PK_TUPLE))
        return ckpt_fail(d->err, -EINVAL, "%s: chunks of \"%.*s\" is %s, not a list", d->path,
                         SHOWN_NAME(fqn, len), list ? kind_of(list, kb, sizeof kb) : "missing");
    chunk *c = calloc(list->n ? list->n : 1, sizeof *c);
    if (!c) return ckpt_fail(d->err, -ENOMEM, "out of memory");
    int rc = 0;
    for (uint32_t k = 0; k < list->n && !rc; k++) {
        const pk_value *v = list->u.c.items[k];
        uint32_t no = 0, ns = 0;
        c[k].pos = v->pos;
        if (!is_obj(v, T_CHUNK_MD)) {
            rc = ckpt_fail(d->err, -EINVAL,
                           "%s: chunk %u of \"%.*s\" at offset %llu is a %s, not a "
                           "ChunkStorageMetadata",
                           d->path, k, SHOWN_NAME(fqn, len), POS(v), kind_of(v, kb, sizeof kb));
            break;
        }
        rc = read_dims(d, attr(v, "offsets"), "chunk offsets", fqn, len, &no, c[k].offsets);
        if (!rc) rc = read_dims(d, attr(v, "sizes"), "chunk sizes", fqn, len, &ns, c[k].sizes);
        if (!rc && (no != ndim || ns != ndim))
            rc = ckpt_fail(d->err, -EINVAL,
                           "%s: chunk %u of \"%.*s\" at offset %llu has %u offsets and %u sizes "
                           "for a tensor of %u dimensions",
                           d->path, k, SHOWN_NAME(fqn, len), POS(v), no, ns, ndim);
        for (uint32_t i = 0; !rc && i < ndim; i++) {
            uint64_t end;
            if (__builtin_add_overflow(c[k].offsets[i], c[k].sizes[i], &end) || end > size[i])
                rc = ckpt_fail(d->err, -EINVAL,
                               "%s: chunk %u of \"%.*s\" at offset %llu: offsets [%s] + sizes "
                               "[%s] lie outside the tensor's size [%s] on dim %u",
                               d->path, k, SHOWN_NAME(fqn, len), POS(v),
                               text_dims(ob, sizeof ob, c[k].offsets, ndim),
                               text_dims(sb, sizeof sb, c[k].sizes, ndim),
                               text_dims(zb, sizeof zb, size, ndim), i);
        }
    }
    if (rc) {
        free(c);
        return rc;
    }
    *out = c;
    *count = list->n;
    return 0;
}

/* Overlapping chunks that are not replicas of one box: the saver refuses them, so do we. */
static int check_overlaps(dcp *d, const chunk *c, uint32_t n, uint32_t ndim, const char *fqn,
                          size_t len) {
    char ab[200], bb[200];
    if (n > MAX_PAIRWISE) return 0; /* the planner's grid still refuses them */
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = i + 1; j < n; j++)
            if (boxes_overlap(&c[i], &c[j], ndim) && !same_box(&c[i], &c[j], ndim))
                return ckpt_fail(d->err, -EINVAL,
                                 "%s: chunks %u (offsets [%s]) and %u (offsets [%s]) of \"%.*s\" "
                                 "at offset %llu overlap without being replicas of one box",
                                 d->path, i, text_dims(ab, sizeof ab, c[i].offsets, ndim), j,
                                 text_dims(bb, sizeof bb, c[j].offsets, ndim), SHOWN_NAME(fqn, len),
                                 (unsigned long long)c[j].pos);
    return 0;
}

/* What a TensorStorageMetadata says, checked: dtype, requires_grad, size and chunk boxes. */
typedef struct tensor_md {
    ckpt_dtype dt;
    bool requires_grad;
    uint32_t ndim, n;
    uint64_t size[CKPT_MAX_DIMS];
    chunk *c; /* n chunks, malloc'd */
} tensor_md;

static int read_tensor_md(dcp *d, const char *fqn, size_t len, const pk_value *md, tensor_md *t) {
    memset(t, 0, sizeof *t);
    t->dt = CKPT_U8;
    int rc = read_properties(d, md, fqn, len, &t->dt, &t->requires_grad);
    if (!rc) rc = read_dims(d, attr(md, "size"), "size", fqn, len, &t->ndim, t->size);
    if (!rc) rc = read_chunks(d, attr(md, "chunks"), fqn, len, t->ndim, t->size, &t->c, &t->n);
    if (!rc) rc = check_overlaps(d, t->c, t->n, t->ndim, fqn, len);
    if (rc) {
        free(t->c);
        t->c = NULL;
    }
    return rc;
}

static int unpack_tensor(const tensor_rec *r, tensor_md *t, ckpt_err *err) {
    memset(t, 0, sizeof *t);
    t->dt = r->dt;
    t->requires_grad = r->requires_grad;
    t->ndim = r->ndim;
    t->n = r->n;
    if (!(t->c = calloc(r->n ? r->n : 1, sizeof *t->c)))
        return ckpt_fail(err, -ENOMEM, "out of memory");
    const uint64_t *v = r->v;
    memcpy(t->size, v, r->ndim * sizeof *v);
    v += r->ndim;
    for (uint32_t k = 0; k < r->n; k++) {
        t->c[k].pos = *v++;
        memcpy(t->c[k].offsets, v, r->ndim * sizeof *v);
        v += r->ndim;
        memcpy(t->c[k].sizes, v, r->ndim * sizeof *v);
        v += r->ndim;
    }
    return 0;
}

static int load_tensor(dcp *d, const pk_value *key, const pk_value *md) {
    const char *fqn = key->u.s.p;
    size_t len = key->u.s.len;
    tensor_md t;
    int rc = is_rec(md, REC_TENSOR) ? unpack_tensor(md->u.record, &t, d->err)
                                    : read_tensor_md(d, fqn, len, md, &t);
    if (rc) return rc;
    ckpt_dtype dt = t.dt;
    bool requires_grad = t.requires_grad;
    uint32_t ndim = t.ndim, n = t.n;
    const uint64_t *size = t.size;
    chunk *c = t.c;
    size_t index = 0;
    rc = add_placed_tensor(d, fqn, len, dt, ndim, size, &index);
    if (rc) {
        free(c);
        return rc;
    }
    /* Replicas: chunks with the same box; sorting by offsets brings them together. */
    const chunk **order = malloc((n ? n : 1) * sizeof *order);
    bool *replica = calloc(n ? n : 1, sizeof *replica);
    if (!order || !replica) rc = ckpt_fail(d->err, -ENOMEM, "out of memory");
    for (uint32_t k = 0; !rc && k < n; k++) order[k] = &c[k];
    if (!rc && n > 1) qsort(order, n, sizeof *order, chunk_cmp);
    for (uint32_t k = 1; !rc && k < n; k++)
        if (chunk_cmp(&order[k - 1], &order[k]) == 0 && same_box(order[k - 1], order[k], ndim))
            replica[order[k] - c] = true;

    strbuf ex;
    sb_init(&ex);
    sb_puts(&ex, "\"fqn\": ");
    sb_json_str(&ex, fqn, len);
    sb_printf(&ex, ", \"requires_grad\": %s, \"chunks\": [", requires_grad ? "true" : "false");
    size_t replicas = 0, listed = 0;
    for (uint32_t k = 0; !rc && k < n; k++) {
        if (replica[k]) {
            replicas++;
            continue;
        }
        if (listed++ >= MAX_LISTED_CHUNKS) {
            strbuf scratch; /* still read and checked, no longer listed */
            sb_init(&scratch);
            rc = add_chunk(d, index, fqn, len, dt, ndim, k, &c[k], &scratch);
            sb_free(&scratch);
            continue;
        }
        if (listed > 1) sb_puts(&ex, ", ");
        rc = add_chunk(d, index, fqn, len, dt, ndim, k, &c[k], &ex);
    }
    if (listed > MAX_LISTED_CHUNKS)
        sb_printf(&ex, ", \"... %zu more\"", listed - MAX_LISTED_CHUNKS);
    sb_putc(&ex, ']');
    if (replicas) sb_printf(&ex, ", \"replicated_chunks\": %zu", replicas);
    if (!rc && (ex.failed || !sb_reserve(&ex, 1))) rc = ckpt_fail(d->err, -ENOMEM, "out of memory");
    if (!rc) rc = catalog_set_extra(d->cat, index, ex.data, d->err);
    sb_free(&ex);
    d->ntensors++;
    d->nchunks += n;
    d->nreplicas += replicas;
    free(order);
    free(replica);
    free(c);
    return rc;
}

/* ---- reading entries while the pickle is parsed ---- */

/* A TensorStorageMetadata that reads cleanly, as a record; NULL when it does not (it then stays
 * a tree and load_tensor says what is wrong, in the order it always has). */
static pk_value *tensor_record(dcp *d, pk_doc *doc, const pk_value *key, const pk_value *md,
                               bool *oom) {
    tensor_md t;
    if (read_tensor_md(d, key->u.s.p, key->u.s.len, md, &t)) return NULL;
    size_t words = t.ndim + (size_t)t.n * (1 + 2 * (size_t)t.ndim);
    tensor_rec *r = arena_alloc(&doc->mem, sizeof *r + words * sizeof(uint64_t));
    pk_value *v = r ? pk_new_record(doc, REC_TENSOR, r, md->pos) : NULL;
    if (v) {
        r->dt = t.dt;
        r->requires_grad = t.requires_grad;
        r->ndim = t.ndim;
        r->n = t.n;
        uint64_t *w = r->v;
        memcpy(w, t.size, t.ndim * sizeof *w);
        w += t.ndim;
        for (uint32_t k = 0; k < t.n; k++) {
            *w++ = t.c[k].pos;
            memcpy(w, t.c[k].offsets, t.ndim * sizeof *w);
            w += t.ndim;
            memcpy(w, t.c[k].sizes, t.ndim * sizeof *w);
            w += t.ndim;
        }
    }
    free(t.c);
    *oom = !v;
    return v;
}

/* A storage_data pair that reads cleanly and has no transforms, as a record; else NULL. */
static pk_value *storage_record(dcp *d, pk_doc *doc, const pk_value *index, const pk_value *info,
                                bool *oom) {
    storage_fields f;
    if (read_storage_head(d, index, info, &f)) return NULL;
    const pk_value *rp = attr(info, "relative_path"), *tr = attr(info, "transform_descriptors");
    if (!rp || rp->kind != PK_STR) return NULL;
    if (tr && tr->kind != PK_NONE && ((tr->kind != PK_LIST && tr->kind != PK_TUPLE) || tr->n))
        return NULL;
    storage_rec *r = arena_alloc(&doc->mem, sizeof *r + f.n * sizeof(uint64_t));
    pk_value *v = r ? pk_new_record(doc, REC_STORAGE, r, index->pos) : NULL;
    if (!v) {
        *oom = true;
        return NULL;
    }
    r->fqn = f.fqn;
    r->fqn_len = f.fqn_len;
    r->rp = rp->u.s.p;
    r->rp_len = rp->u.s.len;
    r->index_pos = f.index_pos;
    r->info_pos = f.info_pos;
    r->rp_pos = rp->pos;
    r->offset = f.offset;
    r->length = f.length;
    r->n = f.n;
    r->has_offsets = f.has_offsets;
    memcpy(r->offsets, f.offsets, f.n * sizeof *r->offsets);
    v->flags |= PK_SHARED; /* it stands for both the key and the value */
    return v;
}

/* Metadata.planner_data is being filled: the Metadata object at the bottom of the stack, its
 * state dict above it, then key/value pairs up to "planner_data". */
static bool filling_planner_data(const pk_pair_site *site) {
    size_t n = site->nbelow;
    return n >= 3 && n % 2 == 1 && is_obj(site->below[0], T_METADATA) &&
           site->below[1]->kind == PK_DICT && pk_is_str(site->below[n - 1], "planner_data");
}

static int on_pair(void *ctx, pk_doc *doc, const pk_pair_site *site, pk_value **key,
                   pk_value **value, ckpt_err *err) {
    dcp *d = ctx;
    ckpt_err quiet, *keep = d->err;
    d->err = &quiet; /* what does not read cleanly is read again, and explained, later */
    bool oom = false;
    pk_value *rec = NULL;
    if ((*key)->kind == PK_STR && is_obj(*value, T_TENSOR_MD)) {
        if ((rec = tensor_record(d, doc, *key, *value, &oom))) *value = rec;
    } else if (is_obj(*key, T_INDEX) && !pk_shared(*key) && is_obj(*value, T_STORAGE_INFO)) {
        if ((rec = storage_record(d, doc, *key, *value, &oom))) *key = *value = rec;
    } else if (((*value)->kind == PK_TUPLE || (*value)->kind == PK_LIST) &&
               filling_planner_data(site)) {
        if (!d->dropped && (d->dropped = pk_new_record(doc, REC_DROPPED, NULL, 0)))
            d->dropped->flags |= PK_SHARED;
        if (d->dropped) *value = d->dropped;
        oom = !d->dropped;
    }
    d->err = keep;
    return oom ? ckpt_fail(err, -ENOMEM, "out of memory") : 0;
}

/* ---- BYTE_IO items ---- */

/* Every BYTE_IO item renders its own pickle (up to CKPT_DOC_LIMIT each): the document of all
 * of them stops at the same limit, or many items would add up without bound. */
static bool values_room(dcp *d, const char *fqn, size_t len) {
    if (d->values.len < CKPT_DOC_LIMIT) return true;
    if (!d->values_full)
        catalog_warn(d->cat,
                     "%s: metadata.json shows BYTE_IO values up to %d MiB: \"%.*s\" and the "
                     "values after it are left out",
                     d->path, CKPT_DOC_LIMIT >> 20, SHOWN_NAME(fqn, len));
    d->values_full = true;
    return false;
}

static void add_value_raw(dcp *d, const char *fqn, size_t len, const char *json) {
    if (!values_room(d, fqn, len)) return;
    if (d->nvalues++) sb_puts(&d->values, ",\n      ");
    sb_json_str(&d->values, fqn, len);
    sb_puts(&d->values, ": ");
    sb_puts(&d->values, json);
}

static int add_blob_tensors(dcp *d, const item *it, const char *fqn, size_t len,
                            const torch_embedded *e) {
    const char *rel = d->cat->sources[d->files[it->file].source].relpath;
    strbuf ex;
    sb_init(&ex);
    int rc = 0;
    for (size_t i = 0; i < e->ntensors && !rc; i++) {
        const torch_embedded_tensor *t = &e->tensors[i];
        size_t index;
        rc = add_placed_tensor(d, t->name, t->name_len, t->dtype, t->ndim, t->shape, &index);
        if (!rc)
            rc = catalog_add_piece(d->cat, index, d->files[it->file].source, t->file_offset, NULL,
                                   NULL, t->row_major ? NULL : t->stride, d->err);
        if (rc) break;
        sb_clear(&ex);
        sb_puts(&ex, "\"fqn\": ");
        sb_json_str(&ex, t->name, t->name_len);
        sb_puts(&ex, ", \"byte_io_item\": ");
        sb_json_str(&ex, fqn, len);
        sb_puts(&ex, ", \"item\": {\"file\": ");
        sb_json_str(&ex, rel, strlen(rel));
        sb_printf(&ex, ", \"offset\": %llu, \"length\": %llu}, \"storage_offset\": %llu",
                  (unsigned long long)it->offset, (unsigned long long)it->length,
                  (unsigned long long)t->storage_offset);
        sb_puts(&ex, ", \"stride\": ");
        put_dims(&ex, t->stride, t->ndim);
        sb_printf(&ex, ", \"requires_grad\": %s", t->requires_grad ? "true" : "false");
        if (ex.failed || !sb_reserve(&ex, 1))
            rc = ckpt_fail(d->err, -ENOMEM, "out of memory");
        else
            rc = catalog_set_extra(d->cat, index, ex.data, d->err);
    }
    sb_free(&ex);
    d->nblob_tensors += e->ntensors;
    return rc;
}

static int load_bytes(dcp *d, const pk_value *key) {
    const char *fqn = key->u.s.p;
    size_t len = key->u.s.len;
    item *it = find_item(d, fqn, len, NULL, 0, false);
    if (!it)
        return ckpt_fail(d->err, -EINVAL,
                         "%s: BYTE_IO item \"%.*s\" at offset %llu has no storage_data entry",
                         d->path, SHOWN_NAME(fqn, len), POS(key));
    it->used = true;
    d->nbytes_items++;
    strbuf sb;
    sb_init(&sb);
    if (it->transforms) {
        sb_printf(&sb,
                  "{\"unreadable\": \"stored through transform_descriptors\", \"length\": %llu}",
                  (unsigned long long)it->length);
        add_value_raw(d, fqn, len, sb.data ? sb.data : "null");
        sb_free(&sb);
        d->nunreadable++;
        warn_limited(d,
                     "%s: BYTE_IO item \"%.*s\" is stored through transform_descriptors, which "
                     "ckptfs cannot undo: its value is not shown",
                     d->path, SHOWN_NAME(fqn, len));
        return 0;
    }
    char label_buf[LABEL_MAX];
    const char *label = item_label(d, it, label_buf, sizeof label_buf);
    torch_embedded e;
    ckpt_err why;
    int rc = torch_zip_read_embedded(d->cat, d->files[it->file].source, it->offset, it->length,
                                     label, fqn, len, &e, &why);
    if (rc == -ENOMEM) {
        *d->err = why;
        return rc;
    }
    if (rc) {
        /* Not fatal: the value is described, the rest of the checkpoint still mounts. */
        sb_puts(&sb, "{\"unreadable\": ");
        sb_json_str(&sb, why.msg, strlen(why.msg));
        sb_printf(&sb, ", \"length\": %llu}", (unsigned long long)it->length);
        add_value_raw(d, fqn, len, sb.data ? sb.data : "null");
        sb_free(&sb);
        d->nunreadable++;
        warn_limited(d, "BYTE_IO item \"%.*s\" is not shown: %s", SHOWN_NAME(fqn, len), why.msg);
        return 0;
    }
    sb_free(&sb);
    if (e.nvalues && values_room(d, fqn, len)) {
        if (d->nvalues++) sb_puts(&d->values, ",\n      ");
        sb_put(&d->values, e.values, e.values_len);
        d->nvalues += e.nvalues - 1;
    }
    if (e.ntensors) {
        rc = add_blob_tensors(d, it, fqn, len, &e);
        if (!rc)
            warn_limited(d,
                         "%s: \"%.*s\" is one BYTE_IO item (torch 1.13 saves a nested state dict "
                         "as a single torch.save blob): the tensors inside it (%zu) are shown "
                         "whole, as one rank saved them (sharded tensors would make it "
                         "unreadable)",
                         d->path, SHOWN_NAME(fqn, len), e.ntensors);
    }
    torch_embedded_free(&e);
    return rc;
}

/* ---- the Metadata object ---- */

static void put_path(strbuf *sb, const pk_value *v) {
    const pk_value *args = v->u.call.args;
    strbuf p;
    sb_init(&p);
    for (uint32_t i = 0; i < args->n; i++) {
        const pk_value *a = args->u.c.items[i];
        if (a->kind != PK_STR) continue;
        if (p.len && p.data[p.len - 1] != '/') sb_putc(&p, '/');
        sb_put(&p, a->u.s.p, a->u.s.len);
    }
    sb_json_str(sb, p.data ? p.data : "", p.len);
    if (p.failed) sb->failed = true;
    sb_free(&p);
}

static void put_value(strbuf *sb, const pk_value *v) {
    size_t budget = 100000;
    if (is_obj(v, T_PATH))
        put_path(sb, v);
    else if (!pk_to_json_within(sb, v, &budget,
                                sb->len < CKPT_DOC_LIMIT ? CKPT_DOC_LIMIT - sb->len : 0, NULL))
        sb_puts(sb, "\"<too large>\"");
}

static void put_storage_meta(strbuf *sb, const pk_value *sm) {
    const pk_value *st = sm->u.call.state;
    if (!st || st->kind != PK_DICT) {
        put_value(sb, sm);
        return;
    }
    sb_putc(sb, '{');
    for (uint32_t i = 0; i < st->n; i++) {
        const pk_value *k = st->u.c.items[2 * i];
        if (i) sb_puts(sb, ", ");
        if (k->kind == PK_STR)
            sb_json_str(sb, k->u.s.p, k->u.s.len);
        else
            sb_puts(sb, "\"?\"");
        sb_puts(sb, ": ");
        put_value(sb, st->u.c.items[2 * i + 1]);
    }
    sb_putc(sb, '}');
}

static const char *const known_attrs[] = {"state_dict_metadata", "planner_data", "storage_data",
                                          "storage_meta", "version"};

static int build_doc(dcp *d, const pk_value *root, const char *doc_key) {
    const pk_global *g = pk_call_global(root);
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "{\n    \"layout\": ");
    sb_json_str(&sb, g->module, strlen(g->module));
    const pk_value *version = attr(root, "version");
    sb_puts(&sb, ",\n    \"version\": ");
    if (version)
        put_value(&sb, version);
    else
        sb_puts(&sb, "null");
    const pk_value *sm = attr(root, "storage_meta");
    if (sm && sm->kind != PK_NONE) {
        sb_puts(&sb, ",\n    \"storage_meta\": ");
        if (sm->kind == PK_CALL)
            put_storage_meta(&sb, sm);
        else
            put_value(&sb, sm);
    }
    const pk_value *pd = attr(root, "planner_data");
    if (pd && pd->kind == PK_DICT) sb_printf(&sb, ",\n    \"planner_data_entries\": %u", pd->n);
    sb_printf(&sb,
              ",\n    \"tensors\": %zu,\n    \"chunks\": %zu,\n    \"replicated_chunks\": %zu,\n"
              "    \"byte_io_items\": %zu,\n    \"byte_io_tensors\": %zu,\n"
              "    \"unreadable_items\": %zu,\n    \"storage_entries\": %zu,\n    \"files\": {",
              d->ntensors, d->nchunks, d->nreplicas, d->nbytes_items, d->nblob_tensors,
              d->nunreadable, d->nitems);
    for (size_t i = 0; i < d->nfiles; i++) {
        const ckpt_source *src = &d->cat->sources[d->files[i].source];
        sb_puts(&sb, i ? ",\n      " : "\n      ");
        sb_json_str(&sb, src->relpath, strlen(src->relpath));
        sb_printf(&sb, ": {\"size\": %llu, \"items\": %zu}", (unsigned long long)src->size,
                  d->files[i].items);
    }
    sb_puts(&sb, d->nfiles ? "\n    }" : "}");
    /* Attributes later torch versions or other projects add: named, not interpreted. */
    const pk_value *st = root->u.call.state;
    size_t other = 0;
    for (uint32_t i = 0; st && st->kind == PK_DICT && i < st->n; i++) {
        const pk_value *k = st->u.c.items[2 * i];
        bool known = false;
        for (size_t j = 0; j < sizeof known_attrs / sizeof *known_attrs; j++)
            known |= pk_is_str(k, known_attrs[j]);
        if (known || k->kind != PK_STR) continue;
        sb_puts(&sb, other++ ? ", " : ",\n    \"other_attributes\": [");
        sb_json_str(&sb, k->u.s.p, k->u.s.len);
    }
    if (other) sb_putc(&sb, ']');
    sb_puts(&sb, ",\n    \"values\": {");
    if (d->nvalues) {
        sb_puts(&sb, "\n      ");
        sb_put(&sb, d->values.data, d->values.len);
        sb_puts(&sb, "\n    ");
    }
    sb_puts(&sb, "}\n  }");
    int rc = sb.failed || d->values.failed
                 ? ckpt_fail(d->err, -ENOMEM, "out of memory")
                 : catalog_add_doc(d->cat, doc_key, sb.data, sb.len, d->err);
    sb_free(&sb);
    return rc;
}

static int read_metadata(dcp *d, const pk_value *root, const char *doc_key) {
    char kb[160];
    if (!is_obj(root, T_METADATA))
        return ckpt_fail(d->err, -EINVAL,
                         "%s: the pickle at offset %llu holds a %s, not a DCP Metadata object",
                         d->path, POS(root), kind_of(root, kb, sizeof kb));
    const pk_value *sdm = attr(root, "state_dict_metadata");
    if (!sdm || sdm->kind != PK_DICT)
        return ckpt_fail(d->err, -EINVAL,
                         "%s: state_dict_metadata of the Metadata object at offset %llu is %s, "
                         "not a dict",
                         d->path, POS(root), sdm ? kind_of(sdm, kb, sizeof kb) : "missing");
    int rc = read_storage_data(d, attr(root, "storage_data"));
    for (uint32_t i = 0; !rc && i < sdm->n; i++) {
        const pk_value *key = sdm->u.c.items[2 * i], *md = sdm->u.c.items[2 * i + 1];
        if (key->kind != PK_STR)
            rc = ckpt_fail(d->err, -EINVAL,
                           "%s: state_dict_metadata key at offset %llu is a %s, not a string",
                           d->path, POS(key), kind_of(key, kb, sizeof kb));
        else if (is_obj(md, T_TENSOR_MD) || is_rec(md, REC_TENSOR))
            rc = load_tensor(d, key, md);
        else if (is_obj(md, T_BYTES_MD))
            rc = load_bytes(d, key);
        else
            rc = ckpt_fail(d->err, -EINVAL,
                           "%s: state_dict_metadata entry \"%.*s\" at offset %llu is a %s, not "
                           "TensorStorageMetadata or BytesStorageMetadata",
                           d->path, SHOWN_NAME(key->u.s.p, key->u.s.len), POS(md),
                           kind_of(md, kb, sizeof kb));
    }
    if (rc) return rc;
    size_t unused = 0;
    for (size_t i = 0; i < d->nitems; i++) unused += !d->items[i].used;
    if (unused)
        catalog_warn(d->cat, "%s: %zu storage_data entries belong to no state_dict_metadata item",
                     d->path, unused);
    if (d->nwarned > MAX_WARNED)
        catalog_warn(d->cat,
                     "%s: %zu more warnings about chunks and BYTE_IO items like the ones "
                     "above",
                     d->path, d->nwarned - MAX_WARNED);
    return build_doc(d, root, doc_key);
}

/* ---- entry points ---- */

static bool is_regular(const char *path) {
    return place_kind(path) == PLACE_FILE;
}

/* A remote checkpoint's shards are opened all at once, not as .metadata names them. */
static void warm_distcp(const char *dir) {
    char **names;
    size_t n;
    if (!ckpt_is_url(dir) || dirlist_files(dir, ".distcp", &names, &n) != 0) return;
    char **paths = calloc(n ? n : 1, sizeof *paths);
    size_t k = 0;
    for (size_t i = 0; paths && i < n; i++) {
        size_t len = strlen(dir) + strlen(names[i]) + 2;
        if (!(paths[k] = malloc(len))) break;
        snprintf(paths[k++], len, "%s/%s", dir, names[i]);
    }
    if (paths) place_warm((const char *const *)paths, k);
    for (size_t i = 0; i < k; i++) free(paths[i]);
    free(paths);
    dirlist_free(names, n);
}

bool dcp_probe(const char *dir) {
    char path[PATH_MAX];
    return snprintf(path, sizeof path, "%s/.metadata", dir) < (int)sizeof path && is_regular(path);
}

int dcp_load_dir(ckpt_catalog *cat, const char *dir, const char *rel_prefix, const char *doc_key,
                 const dcp_layout *how, ckpt_err *err) {
    dcp d;
    memset(&d, 0, sizeof d);
    d.cat = cat;
    d.err = err;
    d.how = how;
    d.dir = dir;
    d.rel_prefix = rel_prefix ? rel_prefix : "";
    arena_init(&d.mem);
    sb_init(&d.values);
    char path[PATH_MAX], rel[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/.metadata", dir) >= (int)sizeof path ||
        snprintf(rel, sizeof rel, "%s.metadata", d.rel_prefix) >= (int)sizeof rel)
        return ckpt_fail(err, -ENAMETOOLONG, "%s: path too long", dir);
    int prc = place_resolve(dir, d.real);
    if (prc) return ckpt_fail(err, prc, "%s: %s", dir, strerror(-prc));
    warm_distcp(dir);
    uint32_t msrc;
    int rc = catalog_add_source(cat, path, rel, &msrc, err);
    if (rc) return rc;
    d.path = cat->sources[msrc].path;
    uint64_t size = cat->sources[msrc].size;
    if (size > METADATA_LIMIT)
        return ckpt_fail(err, -EFBIG, "%s: .metadata is %llu bytes, over the 1 GiB limit", d.path,
                         (unsigned long long)size);
    char *data = malloc(size ? (size_t)size : 1);
    if (!data) return ckpt_fail(err, -ENOMEM, "out of memory");
    rc = ckpt_source_read(cat, msrc, 0, data, (size_t)size, "the Metadata pickle", err);
    pk_doc pd = {0};
    if (!rc) {
        /* torch's own globals (Size, dtypes, _get_layout ...) plus the DCP classes. */
        pk_table tables[2] = {pk_torch_globals, dcp_table};
        pk_hooks hooks = {&d, on_pair};
        pk_options opt = {d.path, 0, tables, 2, {0, 0, 0}, &hooks};
        rc = pk_parse(&pd, data, (size_t)size, &opt, err);
        /* Every way the pickle can end early says so. */
        size_t used = strlen(err->msg);
        if (rc == PK_ETRUNC && !strstr(err->msg, "truncated") && used + 24 < sizeof err->msg)
            snprintf(err->msg + used, sizeof err->msg - used, " (.metadata is truncated)");
    }
    if (!rc) {
        rc = read_metadata(&d, pd.root, doc_key);
        pk_free(&pd);
    }
    free(data);
    free(d.items);
    free(d.files);
    hm_free(&d.item_by_key);
    hm_free(&d.file_by_name);
    sb_free(&d.values);
    arena_free(&d.mem);
    return rc;
}

int dcp_load(ckpt_catalog *cat, ckpt_err *err) {
    return dcp_load_dir(cat, cat->root, "", "dcp", NULL, err);
}

const ckpt_format format_dcp = {
    .name = "dcp",
    .label = "PyTorch DCP",
    .probe_dir = dcp_probe,
    .load_dir = dcp_load,
    .dir_looks_for = "DCP .metadata",
};
