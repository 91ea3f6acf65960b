/* torch-zip: files written by torch.save (pytorch_model.bin, *.pt, *.pth) since torch 1.6.
 *
 * The file is a zip whose records sit under one folder (<archive>/, any name): data.pkl is a
 * pickle of the saved object in which every storage is replaced by a persistent id
 * ("storage", <storage class>, key, location, numel), and data/<key> holds that storage's raw
 * little-endian bytes, stored uncompressed. Tensors are rebuilt by
 * torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, hooks)
 * (v3 adds an explicit dtype for untyped storages), optionally wrapped in _rebuild_parameter or
 * _rebuild_from_type_v2. ckptfs reads the pickle with its restricted reader (nothing is
 * imported or run), turns each rebuild call into a tensor whose bytes are served straight from
 * the storage record — one piece at storage_offset, strided when the view is not row-major —
 * and shows the other values (epoch, hyper-parameters ...) in metadata.json under "pickle".
 * The same reader serves the torch.save archives embedded in DCP .distcp files (torch_zip.h):
 * there it hands tensors and values back to the caller instead of the catalog.
 *
 * Names: nested dicts and lists become dotted paths ({"model": {"w": t}} -> "model.w", list
 * items by index); a tensor saved on its own takes the archive's name (legacy files: the file
 * name without its extension). Sidecars add the storage key, storage_offset, stride,
 * requires_grad, device, and the other tensors viewing the same storage (tied weights).
 *
 * The legacy format (torch < 1.6, or _use_new_zipfile_serialization=False) is a sequence of
 * pickles — magic number, protocol version, sys_info, the object, the list of storage keys —
 * followed by each storage as an 8-byte element count and its bytes, in key-list order. It is
 * read the same way once the storages' offsets are known. */
#include "torch_zip.h"
#include "../util/grow.h"
#include "../util/le.h"

#include "../util/hashmap.h"
#include "../parse/pickle.h"
#include "../util/search.h"
#include "../util/strbuf.h"
#include "../parse/zip.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PICKLE_LIMIT (1ull << 30)
enum { MAX_DEPTH = 64, MAX_UNWRAP = 8, MAX_SHARED_LISTED = 4 };
/* A dict key that is not a string names what is under it by its JSON text, up to this size. */
enum { KEY_NAME_MAX = 8192 };

/* LONG1 of torch.serialization.MAGIC_NUMBER 0x1950a86a20f9469cfc6c after PROTO 2. */
static const unsigned char legacy_magic[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c,
                                             0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};

static bool probe(const unsigned char *head, size_t n, uint64_t file_size) {
    (void)file_size;
    if (n >= 4 && memcmp(head, "PK\3\4", 4) == 0) return true;
    return n >= sizeof legacy_magic && memcmp(head, legacy_magic, sizeof legacy_magic) == 0;
}

typedef struct storage {
    const char *key; /* points into the pickle */
    size_t key_len;
    const pk_global *cls;
    uint64_t numel;  /* in elements of cls (bytes for untyped storages) */
    uint64_t offset; /* file offset of the record's bytes */
    uint64_t nbytes;
    const char *location;
    size_t location_len;
    size_t users;      /* tensors viewing it */
    size_t first_user; /* catalog index of the first */
    size_t more_at;    /* with 2 users or more: the next MAX_SHARED_LISTED in loader.more_users */
} storage;

/* A storage of a legacy file: its element count header is followed by its bytes. */
typedef struct legacy_storage {
    uint64_t offset; /* of the bytes, after the 8-byte count */
    uint64_t numel;
    unsigned esz;
} legacy_storage;

/* ---- sidecar extras: storage key, layout, requires_grad, tensors sharing the storage ----
 * Rendered when a sidecar is read, byte for byte the text that was made at load (~290 bytes a
 * tensor in a state dict of 300,000 views of one flat buffer, naming 4 other users of it).
 * What a storage shows is kept once for all its users (the first users by name); what a tensor
 * shows is read from its piece: the storage holding the piece's offset, the offset in elements,
 * the piece's strides (or the contiguous ones). Tensors whose piece does not tell (an empty
 * view not at the storage's start, strides that differ from the contiguous ones only where a
 * size is 1, ...) keep their own record; the others share one of two a file, by
 * requires_grad. */

/* What every sidecar of a storage's tensors shows of it. */
typedef struct storage_extra {
    const char *key, *location; /* copies in the catalog's arena */
    size_t key_len, location_len;
    uint64_t offset; /* of its bytes in the file */
    size_t users;
    const char **first_names; /* users > 1: the first min(users, MAX_SHARED_LISTED + 1) users */
    size_t *first_lens;       /* (their names: the catalog's text, which stays where it is) */
} storage_extra;

/* One file's storages. */
typedef struct torch_extras {
    const storage_extra *storages;
    /* Their offsets ascending, and which storage each is, when their bytes do not overlap
     * (else NULL: no tensor is then read from its piece). */
    const uint64_t *offsets;
    const uint32_t *by_offset;
    size_t nstorages;
} torch_extras;

typedef struct torch_extra {
    ckpt_extra head;
    const torch_extras *file;
    bool from_piece; /* storage, storage_offset and strides are read from the tensor's piece */
    bool requires_grad;
    bool own_strides; /* strides[ndim] follow; else they are the contiguous ones */
    uint32_t storage;
    uint64_t storage_offset;
    uint64_t strides[];
} torch_extra;

/* A persistent id as records share it: the tensors of a state dict of views name one storage
 * in a row, and keep one copy of what it says (key, class, location, numel). */
typedef struct shared_ref {
    const pk_global *cls;
    const char *key, *location;
    size_t key_len, location_len;
    uint64_t numel;
} shared_ref;

/* A tensor the walk found, in 40 bytes. The catalog gets it once the pickle's tree is freed:
 * the two side by side were the peak of a big state dict. */
typedef struct found_tensor {
    const char *name; /* in the pickle (a key of the saved dict) or in loader.scratch */
    uint64_t storage_offset;
    union {
        const uint64_t *dims; /* shape[ndim], then stride[ndim], in loader.scratch */
        uint64_t size;        /* vector: its one size (stride 1) */
    } u;
    uint32_t name_len;
    uint32_t storage;
    uint8_t dtype, ndim, esz; /* esz: bytes an element of the storage view */
    bool requires_grad, vector;
} found_tensor;

typedef struct loader {
    ckpt_catalog *cat;
    uint32_t source;
    const char *path; /* names the file (or the embedded archive) in messages */
    ckpt_err *err;
    uint64_t base, length;    /* the zip's range of the source */
    torch_embedded *embedded; /* non-NULL: tensors go here, not into the catalog */
    size_t cap_embedded;
    zip_archive zip;
    bool legacy;
    hashmap legacy_by_key; /* storage key -> legacy_storages index */
    legacy_storage *legacy_storages;
    const char *prefix; /* "archive/" */
    size_t prefix_len;
    char label[640];
    hashmap storage_by_key;
    storage *storages;
    size_t nstorages, cap_storages;
    found_tensor *found; /* the walk's tensors, added to the catalog after the tree is freed */
    size_t nfound, cap_found;
    arena scratch;         /* their dims, and names that are not a key of the pickle */
    const char *name_text; /* the pickle's bytes of the name being visited when it is one key */
    size_t *more_users;    /* catalog indexes: see storage.more_at */
    size_t nmore, cap_more;
    torch_extras *extras;       /* in the catalog's arena, made before the first tensor */
    torch_extra *from_piece[2]; /* the records tensors share, by requires_grad */
    const shared_ref *last_ref; /* in the pickle being parsed: the newest of its records' */
    size_t records;             /* tensors read into records: room for the walk's */
    strbuf name;                /* dotted path of the value being visited */
    strbuf meta;                /* members of the "pickle" document */
    size_t nmeta;
    bool meta_cut; /* the document reached CKPT_DOC_LIMIT */
    size_t budget; /* values the walk may still visit (shared values are visited again) */
    const pk_table *extra_globals; /* a caller's table besides torch's, or NULL */
} loader;

/* What a persistent id ("storage", class, key, location, numel) says, and where it is. */
typedef struct storage_ref {
    shared_ref id;
    uint64_t pos; /* of the persistent id, for messages */
} storage_ref;

/* What a rebuild call says about one tensor. */
typedef struct tensor_desc {
    uint64_t pos; /* of the call */
    const pk_value *persid;
    const pk_value *dtype; /* v3 only */
    storage_ref ref;       /* read from persid */
    /* dtype, read: the global (NULL when it is no global) and its offset */
    bool has_dtype;
    const pk_global *dtype_g;
    uint64_t dtype_pos;
    uint64_t storage_offset;
    uint32_t ndim;
    uint64_t shape[CKPT_MAX_DIMS], stride[CKPT_MAX_DIMS];
    bool requires_grad;
} tensor_desc;

#define POS(v) ((unsigned long long)(v)->pos)

/* The tensor's name for messages, escaped (it may hold NUL bytes). */
static const char *shown_name(loader *l) {
    if (l->name.failed) return "?";
    return ckpt_shown(l->name.data, l->name.len);
}

static int tensor_fail_at(loader *l, uint64_t pos, const char *fmt, va_list ap) {
    char what[320];
    vsnprintf(what, sizeof what, fmt, ap);
    const char *name = shown_name(l);
    return ckpt_fail(l->err, -EINVAL, "%s: tensor \"%.*s\": %s (at offset %llu)", l->label, -1,
                     name, what, (unsigned long long)pos);
}

static int tensor_fail(loader *l, const pk_value *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int tensor_fail(loader *l, const pk_value *at, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = tensor_fail_at(l, at ? at->pos : 0, fmt, ap);
    va_end(ap);
    return rc;
}

/* The same for a value already read into a record: by its offset. */
static int tensor_fail_pos(loader *l, uint64_t pos, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int tensor_fail_pos(loader *l, uint64_t pos, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = tensor_fail_at(l, pos, fmt, ap);
    va_end(ap);
    return rc;
}

/* ---- reading arguments ---- */

static bool as_u64(const pk_value *v, uint64_t *out) {
    if (!v || v->kind != PK_INT || v->u.i < 0) return false;
    *out = (uint64_t)v->u.i;
    return true;
}

/* A size or stride: a tuple (or list, or torch.Size) of ints. */
static const pk_value *int_tuple(const pk_value *v) {
    if (v && v->kind == PK_CALL && pk_call_global(v)->tag == PK_G_SIZE && v->u.call.args->n == 1)
        v = v->u.call.args->u.c.items[0];
    return v && (v->kind == PK_TUPLE || v->kind == PK_LIST) ? v : NULL;
}

static int read_dims(loader *l, const pk_value *v, const char *what, uint32_t *ndim,
                     uint64_t *out) {
    const pk_value *t = int_tuple(v);
    if (!t)
        return tensor_fail(l, v, "%s is a %s, not a tuple of ints", what, pk_kind_name(v->kind));
    if (t->n > CKPT_MAX_DIMS)
        return tensor_fail(l, t, "%s has %u dimensions (at most %d supported)", what, t->n,
                           CKPT_MAX_DIMS);
    for (uint32_t i = 0; i < t->n; i++) {
        const pk_value *d = t->u.c.items[i];
        if (d->kind != PK_INT)
            return tensor_fail(l, d, "%s entry %u is a %s, not an int", what, i,
                               pk_kind_name(d->kind));
        if (d->u.i < 0)
            return tensor_fail(l, d, "%s entry %u is negative (%lld)", what, i, (long long)d->u.i);
        out[i] = (uint64_t)d->u.i;
    }
    *ndim = t->n;
    return 0;
}

static int read_rebuild_args(loader *l, const pk_global *g, const pk_value *args,
                             const pk_value *at, tensor_desc *td) {
    uint32_t need = g->tag == PK_G_REBUILD_V3 ? 7 : g->tag == PK_G_REBUILD_V2 ? 6 : 4;
    if (args->n < need)
        return tensor_fail(l, at, "%s.%s has %u arguments, expected at least %u", g->module,
                           g->name, args->n, need);
    pk_value *const *a = args->u.c.items;
    td->persid = a[0];
    if (!as_u64(a[1], &td->storage_offset))
        return tensor_fail(l, a[1], "storage_offset is not a non-negative int");
    uint32_t nstride = 0;
    int rc = read_dims(l, a[2], "size", &td->ndim, td->shape);
    if (!rc) rc = read_dims(l, a[3], "stride", &nstride, td->stride);
    if (rc) return rc;
    if (nstride != td->ndim)
        return tensor_fail(l, a[3], "stride has %u entries but size has %u", nstride, td->ndim);
    if (g->tag != PK_G_REBUILD_TENSOR) {
        if (a[4]->kind != PK_BOOL)
            return tensor_fail(l, a[4], "requires_grad is a %s, not a bool",
                               pk_kind_name(a[4]->kind));
        td->requires_grad = a[4]->u.b;
    }
    if (g->tag == PK_G_REBUILD_V3) td->dtype = a[6];
    return 0;
}

/* Unwraps Parameter and subclass wrappers down to the rebuild call. */
static int describe_tensor(loader *l, const pk_global *g, const pk_value *args, const pk_value *at,
                           int depth, tensor_desc *td) {
    char gname[160];
    if (depth > MAX_UNWRAP) return tensor_fail(l, at, "tensor wrappers nest too deeply");
    switch (g->tag) {
    case PK_G_REBUILD_TENSOR:
    case PK_G_REBUILD_V2:
    case PK_G_REBUILD_V3:
        return read_rebuild_args(l, g, args, at, td);
    case PK_G_REBUILD_PARAMETER:
    case PK_G_REBUILD_PARAMETER_STATE: {
        if (args->n < 2)
            return tensor_fail(l, at, "%s has %u arguments, expected at least 2",
                               pk_global_name(g, gname, sizeof gname), args->n);
        const pk_value *inner = args->u.c.items[0], *rg = args->u.c.items[1];
        const pk_global *ig = pk_call_global(inner);
        if (!ig)
            return tensor_fail(l, inner, "%s wraps a %s, not a tensor",
                               pk_global_name(g, gname, sizeof gname), pk_kind_name(inner->kind));
        int rc = describe_tensor(l, ig, inner->u.call.args, inner, depth + 1, td);
        if (rc) return rc;
        if (rg->kind != PK_BOOL) return tensor_fail(l, rg, "requires_grad is not a bool");
        td->requires_grad = rg->u.b;
        return 0;
    }
    case PK_G_REBUILD_FROM_TYPE: {
        if (args->n < 3)
            return tensor_fail(l, at, "%s has %u arguments, expected 4",
                               pk_global_name(g, gname, sizeof gname), args->n);
        const pk_value *fn = args->u.c.items[0], *type = args->u.c.items[1],
                       *fargs = args->u.c.items[2];
        if (fn->kind != PK_GLOBAL || fargs->kind != PK_TUPLE)
            return tensor_fail(l, at, "%s needs a function and an argument tuple",
                               pk_global_name(g, gname, sizeof gname));
        if (type->kind != PK_GLOBAL || type->u.global->tag != PK_G_TENSOR_CLASS)
            return tensor_fail(l, type, "tensor subclass %s is not supported",
                               type->kind == PK_GLOBAL
                                   ? pk_global_name(type->u.global, gname, sizeof gname)
                                   : pk_kind_name(type->kind));
        return describe_tensor(l, fn->u.global, fargs, at, depth + 1, td);
    }
    case PK_G_REBUILD_OTHER:
        return tensor_fail(l, at, "%s (%s) is not supported",
                           pk_global_name(g, gname, sizeof gname), g->note);
    default:
        return tensor_fail(l, at, "%s does not make a tensor",
                           pk_global_name(g, gname, sizeof gname));
    }
}

/* ---- storages ---- */

/* The bytes of storage `key` in a zip: record <archive>/data/<key>, numel x esz bytes. */
static int locate_record(loader *l, uint64_t persid_pos, const char *key, size_t klen,
                         const pk_global *cls, uint64_t numel, storage *s) {
    strbuf rec;
    sb_init(&rec);
    sb_put(&rec, l->prefix, l->prefix_len);
    sb_puts(&rec, "data/");
    sb_put(&rec, key, klen);
    if (rec.failed) {
        sb_free(&rec);
        return ckpt_fail(l->err, -ENOMEM, "out of memory");
    }
    const zip_entry *e = zip_find(&l->zip, rec.data, rec.len);
    int rc = 0;
    if (!e) {
        rc = tensor_fail_pos(l, persid_pos,
                             "persistent id names storage \"%.*s\" but the archive has no record "
                             "\"%.*s\"",
                             SHOWN_NAME(key, klen), SHOWN_NAME(rec.data, rec.len));
    } else if (!(rc = zip_data_offset(&l->zip, e, &s->offset, l->err))) {
        uint64_t want;
        if (__builtin_mul_overflow(numel, (uint64_t)cls->esz, &want) || want != e->usize)
            rc = tensor_fail_pos(l, persid_pos,
                                 "storage \"%.*s\" declares %llu elements of %u bytes but record "
                                 "\"%.*s\" holds %llu bytes",
                                 SHOWN_NAME(key, klen), (unsigned long long)numel, cls->esz,
                                 SHOWN_NAME(rec.data, rec.len), (unsigned long long)e->usize);
        s->nbytes = e->usize;
    }
    sb_free(&rec);
    return rc;
}

/* The bytes of storage `key` in a legacy file: found by the scan of the storage section. */
static int locate_legacy(loader *l, uint64_t persid_pos, const char *key, size_t klen,
                         const pk_global *cls, uint64_t numel, storage *s) {
    const hm_entry *he = hm_get(&l->legacy_by_key, key, klen);
    if (!he) /* cannot happen: every persistent id was collected */
        return tensor_fail_pos(l, persid_pos,
                               "persistent id names storage \"%.*s\" but the file's storage list "
                               "does not",
                               SHOWN_NAME(key, klen));
    const legacy_storage *ls = &l->legacy_storages[he->value];
    if (ls->numel == UINT64_MAX)
        return tensor_fail_pos(l, persid_pos,
                               "persistent id names storage \"%.*s\" but the file's storage list "
                               "does not",
                               SHOWN_NAME(key, klen));
    if (ls->numel != numel || ls->esz != cls->esz)
        return tensor_fail_pos(
            l, persid_pos,
            "storage \"%.*s\" declares %llu elements of %u bytes but its data at "
            "offset %llu holds %llu elements of %u bytes",
            SHOWN_NAME(key, klen), (unsigned long long)numel, cls->esz,
            (unsigned long long)ls->offset, (unsigned long long)ls->numel, ls->esz);
    s->offset = ls->offset;
    s->nbytes = ls->numel * ls->esz;
    return 0;
}

/* Reads a persistent id ("storage", class, key, location, numel); nothing is looked up. */
static int read_persid(loader *l, const pk_value *persid, storage_ref *ref) {
    char gname[160];
    if (persid->kind != PK_PERSID)
        return tensor_fail(l, persid, "storage argument is a %s, not a persistent id",
                           pk_kind_name(persid->kind));
    const pk_value *id = persid->u.persid;
    if (id->kind != PK_TUPLE || id->n < 5 || !pk_is_str(id->u.c.items[0], "storage"))
        return tensor_fail(l, persid,
                           "persistent id is not a (\"storage\", class, key, location, numel) "
                           "tuple");
    pk_value *const *f = id->u.c.items;
    if (id->n > 5 && f[5]->kind != PK_NONE)
        return tensor_fail(l, persid, "storage views (legacy view metadata) are not supported");
    if (f[1]->kind != PK_GLOBAL || f[1]->u.global->tag != PK_G_STORAGE)
        return tensor_fail(l, f[1], "storage class is a %s, not a torch storage class",
                           f[1]->kind == PK_GLOBAL
                               ? pk_global_name(f[1]->u.global, gname, sizeof gname)
                               : pk_kind_name(f[1]->kind));
    const pk_global *cls = f[1]->u.global;
    if (cls->note)
        return tensor_fail(l, f[1], "storage class %s (%s) is not supported",
                           pk_global_name(cls, gname, sizeof gname), cls->note);
    if (f[2]->kind != PK_STR) return tensor_fail(l, f[2], "storage key is not a string");
    if (f[3]->kind != PK_STR) return tensor_fail(l, f[3], "storage location is not a string");
    if (!as_u64(f[4], &ref->id.numel))
        return tensor_fail(l, f[4], "storage numel is not a non-negative int");
    ref->id.cls = cls;
    ref->id.key = f[2]->u.s.p;
    ref->id.key_len = f[2]->u.s.len;
    ref->id.location = f[3]->u.s.p;
    ref->id.location_len = f[3]->u.s.len;
    ref->pos = persid->pos;
    return 0;
}

static int find_storage(loader *l, const storage_ref *ref, size_t *index) {
    char gname[160];
    const pk_global *cls = ref->id.cls;
    uint64_t numel = ref->id.numel;
    const char *key = ref->id.key;
    size_t klen = ref->id.key_len;

    bool added;
    hm_entry *he = hm_put(&l->storage_by_key, key, klen, l->nstorages, &added);
    if (!he) return ckpt_fail(l->err, -ENOMEM, "out of memory");
    if (!added) {
        const storage *s = &l->storages[he->value];
        if (s->cls != cls || s->numel != numel)
            return tensor_fail_pos(
                l, ref->pos,
                "storage \"%.*s\" is described as %s of %llu elements here but as "
                "%s.%s of %llu elements before",
                SHOWN_NAME(key, klen), pk_global_name(cls, gname, sizeof gname),
                (unsigned long long)numel, s->cls->module, s->cls->name,
                (unsigned long long)s->numel);
        *index = he->value;
        return 0;
    }
    if (GROW(l->storages, l->cap_storages, l->nstorages + 1))
        return ckpt_fail(l->err, -ENOMEM, "out of memory");
    storage *s = &l->storages[l->nstorages];
    memset(s, 0, sizeof *s);
    int rc = l->legacy ? locate_legacy(l, ref->pos, key, klen, cls, numel, s)
                       : locate_record(l, ref->pos, key, klen, cls, numel, s);
    if (rc) return rc;
    s->key = key;
    s->key_len = klen;
    s->cls = cls;
    s->numel = numel;
    s->location = ref->id.location;
    s->location_len = ref->id.location_len;
    *index = l->nstorages++;
    return 0;
}

/* ---- tensors ---- */

static bool row_major(const tensor_desc *td) {
    uint64_t expect = 1;
    for (uint32_t d = td->ndim; d-- > 0;) {
        if (td->shape[d] != 1 && td->stride[d] != expect) return false;
        expect *= td->shape[d];
    }
    return true;
}

/* ---- tensors read while the pickle is parsed ---- */

enum { REC_TENSOR = 1 };

/* A rebuild call read into a record: td without the pointers into the tree, 40 bytes for a
 * vector (it was 112, for each tensor of a state dict while the pickle is read). Offsets are the
 * call's (the record's pos) less the distances kept here. */
typedef struct tensor_rec {
    const shared_ref *ref;
    uint64_t storage_offset;
    uint32_t persid_back; /* the persistent id's offset is pos - persid_back */
    uint8_t ndim;
    bool has_dtype, requires_grad;
    uint64_t dims[]; /* shape[ndim], stride[ndim]; with has_dtype then a rec_dtype */
} tensor_rec;

/* The dtype argument of a v3 call, after the dims. */
typedef struct rec_dtype {
    const pk_global *g;
    uint64_t back; /* its offset is pos - back */
} rec_dtype;

static bool is_tensor_rec(const pk_value *v) {
    return v && v->kind == PK_RECORD && v->n == REC_TENSOR;
}

/* Everything a rebuild call says that is read without the archive. */
static int read_tensor(loader *l, const pk_value *v, tensor_desc *td) {
    memset(td, 0, sizeof *td);
    if (is_tensor_rec(v)) {
        const tensor_rec *r = v->u.record;
        td->pos = v->pos;
        td->storage_offset = r->storage_offset;
        td->ref = (storage_ref){*r->ref, v->pos - r->persid_back};
        td->has_dtype = r->has_dtype;
        td->requires_grad = r->requires_grad;
        td->ndim = r->ndim;
        memcpy(td->shape, r->dims, r->ndim * sizeof *r->dims);
        memcpy(td->stride, r->dims + r->ndim, r->ndim * sizeof *r->dims);
        if (r->has_dtype) {
            rec_dtype dt;
            memcpy(&dt, r->dims + 2 * r->ndim, sizeof dt);
            td->dtype_g = dt.g;
            td->dtype_pos = v->pos - dt.back;
        }
        return 0;
    }
    td->pos = v->pos;
    int rc = describe_tensor(l, pk_call_global(v), v->u.call.args, v, 0, td);
    if (!rc) rc = read_persid(l, td->persid, &td->ref);
    if (!rc && td->dtype) {
        td->has_dtype = true;
        td->dtype_g = td->dtype->kind == PK_GLOBAL ? td->dtype->u.global : NULL;
        td->dtype_pos = td->dtype->pos;
    }
    td->persid = td->dtype = NULL; /* what follows works from what was read */
    return rc;
}

/* Resolves a rebuild call (or its record) to its dtype, layout and storage, checking that
 * every element it addresses lies inside the storage; *file_offset is where element 0 lives.
 * (A DCP reader needs exactly this for the one tensor of each embedded archive.) */
static int resolve_tensor(loader *l, const pk_value *v, tensor_desc *td, ckpt_dtype *dtype_out,
                          uint64_t *file_offset, size_t *storage_index, unsigned *esz_out) {
    char gname[160];
    int rc = read_tensor(l, v, td);
    size_t si = 0;
    if (!rc) rc = find_storage(l, &td->ref, &si);
    if (rc) return rc;
    const storage *s = &l->storages[si];

    ckpt_dtype dtype;
    uint64_t esz, storage_elems;
    if (td->has_dtype) {
        const pk_global *dg = td->dtype_g;
        if (!dg || dg->tag != PK_G_DTYPE)
            return tensor_fail_pos(l, td->dtype_pos, "dtype argument is not a torch dtype");
        if (dg->dtype < 0)
            return tensor_fail_pos(l, td->dtype_pos, "dtype %s (%s) is not supported",
                                   pk_global_name(dg, gname, sizeof gname), dg->note);
        dtype = (ckpt_dtype)dg->dtype;
        esz = dg->esz;
        if (s->nbytes % esz)
            return tensor_fail_pos(l, td->dtype_pos,
                                   "storage \"%.*s\" of %llu bytes is not a whole number of "
                                   "%s elements",
                                   SHOWN_NAME(s->key, s->key_len), (unsigned long long)s->nbytes,
                                   pk_global_name(dg, gname, sizeof gname));
        storage_elems = s->nbytes / esz;
    } else {
        if (s->cls->dtype < 0)
            return tensor_fail(l, v,
                               "storage class %s has no dtype and no _rebuild_tensor_v3 "
                               "gives one",
                               pk_global_name(s->cls, gname, sizeof gname));
        dtype = (ckpt_dtype)s->cls->dtype;
        esz = s->cls->esz;
        storage_elems = s->numel;
    }

    /* Every element the view addresses must lie inside the storage. */
    uint64_t numel = 1, last = td->storage_offset;
    bool overflow = false;
    for (uint32_t d = 0; d < td->ndim; d++)
        overflow |= __builtin_mul_overflow(numel, td->shape[d], &numel);
    uint64_t nbytes;
    overflow |= __builtin_mul_overflow(numel, esz, &nbytes);
    if (overflow) return tensor_fail(l, v, "shape product overflows");
    if (numel) {
        for (uint32_t d = 0; d < td->ndim; d++) {
            uint64_t span;
            if (__builtin_mul_overflow(td->shape[d] - 1, td->stride[d], &span) ||
                __builtin_add_overflow(last, span, &last))
                return tensor_fail(l, v, "strides overflow (dim %u: size %llu, stride %llu)", d,
                                   (unsigned long long)td->shape[d],
                                   (unsigned long long)td->stride[d]);
        }
        if (last >= storage_elems)
            return tensor_fail(l, v,
                               "storage \"%.*s\" holds %llu elements but storage_offset %llu with "
                               "this size and stride reaches element %llu",
                               SHOWN_NAME(s->key, s->key_len), (unsigned long long)storage_elems,
                               (unsigned long long)td->storage_offset, (unsigned long long)last);
    }
    /* An empty view addresses nothing: its offset is not checked, so not used. */
    *file_offset = s->offset + (numel ? td->storage_offset * esz : 0);
    *dtype_out = dtype;
    *storage_index = si;
    *esz_out = (unsigned)esz;
    return 0;
}

/* An embedded archive's tensor, handed back to the caller (torch_zip_read_embedded). */
static int add_embedded(loader *l, const pk_value *v, const tensor_desc *td, ckpt_dtype dtype,
                        uint64_t file_offset, const char *name) {
    /* name: l->name's l->name.len bytes (NUL bytes included) */
    torch_embedded *e = l->embedded;
    if (GROW(e->tensors, l->cap_embedded, e->ntensors + 1))
        return ckpt_fail(l->err, -ENOMEM, "out of memory");
    torch_embedded_tensor *t = &e->tensors[e->ntensors];
    memset(t, 0, sizeof *t);
    if (!(t->name = malloc(l->name.len + 1))) return ckpt_fail(l->err, -ENOMEM, "out of memory");
    memcpy(t->name, name, l->name.len);
    t->name[l->name.len] = '\0';
    t->name_len = l->name.len;
    t->dtype = dtype;
    t->ndim = td->ndim;
    memcpy(t->shape, td->shape, sizeof t->shape);
    memcpy(t->stride, td->stride, sizeof t->stride);
    t->row_major = row_major(td);
    t->storage_offset = td->storage_offset;
    t->file_offset = file_offset;
    t->requires_grad = td->requires_grad;
    t->pos = v->pos;
    e->ntensors++;
    return 0;
}

/* The strides a contiguous tensor of this shape has (also for sizes 0 and 1, as torch makes
 * them). */
static void contiguous_strides(const uint64_t *shape, uint32_t ndim, uint64_t *out) {
    uint64_t expect = 1;
    for (uint32_t d = ndim; d-- > 0;) {
        out[d] = expect;
        expect *= shape[d];
    }
}

static void render_extra(const ckpt_extra *xh, const ckpt_tensor *t, strbuf *sb);
static const ckpt_extra_kind torch_extra_kind = {render_extra};

/* `"storage": key, "storage_offset": n, "stride": [...], "requires_grad": b, "device": loc`,
 * then for a storage of several tensors the first MAX_SHARED_LISTED others ("..." when there are
 * more) and how many use it. */
static void render_extra(const ckpt_extra *xh, const ckpt_tensor *t, strbuf *sb) {
    const torch_extra *x = (const torch_extra *)xh;
    const torch_extras *f = x->file;
    uint64_t contiguous[CKPT_MAX_DIMS] = {0};
    contiguous_strides(t->shape, t->ndim, contiguous);
    const uint64_t *stride = x->own_strides ? x->strides : contiguous;
    size_t si = x->storage;
    uint64_t storage_offset = x->storage_offset;
    if (x->from_piece && t->npieces) {
        const ckpt_piece *p = &t->pieces[0];
        si = f->by_offset[last_at_or_before(f->offsets, f->nstorages, p->file_offset)];
        unsigned esz = ckpt_dtype_elem_size(t->dtype);
        storage_offset = esz ? (p->file_offset - f->storages[si].offset) / esz : 0;
        if (p->strides) stride = p->strides;
    }
    const storage_extra *s = &f->storages[si];
    sb_puts(sb, "\"storage\": ");
    sb_json_str(sb, s->key, s->key_len);
    sb_puts(sb, ", \"storage_offset\": ");
    sb_u64(sb, storage_offset);
    sb_puts(sb, ", \"stride\": [");
    for (uint32_t d = 0; d < t->ndim; d++) {
        if (d) sb_puts(sb, ", ");
        sb_u64(sb, stride[d]);
    }
    sb_printf(sb, "], \"requires_grad\": %s, \"device\": ", x->requires_grad ? "true" : "false");
    sb_json_str(sb, s->location, s->location_len);
    if (s->users < 2) return;
    sb_puts(sb, ", \"shared_with\": [");
    size_t others = s->users - 1, listed = 0;
    size_t first = s->users < MAX_SHARED_LISTED + 1 ? s->users : MAX_SHARED_LISTED + 1;
    for (size_t k = 0; k < first && listed < MAX_SHARED_LISTED; k++) {
        if (s->first_names[k] == t->name) continue; /* the tensor itself */
        if (listed++) sb_puts(sb, ", ");
        sb_json_str(sb, s->first_names[k], s->first_lens[k]);
    }
    if (others > MAX_SHARED_LISTED) sb_puts(sb, ", \"...\"");
    sb_putc(sb, ']');
    sb_printf(sb, ", \"storage_users\": %zu", s->users);
}

static int order_by_offset(const void *a, const void *b, void *ctx) {
    const storage *st = ctx;
    uint64_t x = st[*(const uint32_t *)a].offset, y = st[*(const uint32_t *)b].offset;
    return x < y ? -1 : x > y;
}

/* The file's extras, with its storages by offset: all are known once the walk is over. */
static int start_extras(loader *l) {
    arena *mem = &l->cat->priv->mem;
    torch_extras *f = arena_alloc(mem, sizeof *f);
    if (!f || l->nstorages > UINT32_MAX) return ckpt_fail(l->err, -ENOMEM, "out of memory");
    l->extras = f;
    f->nstorages = l->nstorages;
    uint64_t *offsets = arena_array(mem, l->nstorages ? l->nstorages : 1, sizeof *offsets);
    uint32_t *order = arena_array(mem, l->nstorages ? l->nstorages : 1, sizeof *order);
    if (!offsets || !order) return ckpt_fail(l->err, -ENOMEM, "out of memory");
    for (size_t i = 0; i < l->nstorages; i++) order[i] = (uint32_t)i;
    qsort_r(order, l->nstorages, sizeof *order, order_by_offset, l->storages);
    bool apart = true;
    for (size_t i = 0; i < l->nstorages; i++) {
        const storage *s = &l->storages[order[i]];
        offsets[i] = s->offset;
        /* Records of a hostile zip may share bytes: then an offset names no one storage. */
        if (i + 1 < l->nstorages && s->offset + s->nbytes >= l->storages[order[i + 1]].offset &&
            (s->nbytes || s->offset == l->storages[order[i + 1]].offset))
            apart = false;
    }
    if (apart) {
        f->offsets = offsets;
        f->by_offset = order;
    }
    return 0;
}

/* Tensor `index` of the catalog views storage si at file_offset: its extras, and the storage's
 * users. */
static int add_extra(loader *l, const tensor_desc *td, size_t si, size_t index, unsigned esz,
                     ckpt_dtype dtype, bool empty) {
    arena *mem = &l->cat->priv->mem;
    uint64_t contiguous[CKPT_MAX_DIMS] = {0};
    contiguous_strides(td->shape, td->ndim, contiguous);
    bool own_strides = memcmp(contiguous, td->stride, td->ndim * sizeof *td->stride) != 0;
    /* What the piece tells: its offset (not for an empty view), its strides (given unless the
     * view is row-major), the element size of its dtype. */
    bool from_piece = l->extras->by_offset && esz && esz == ckpt_dtype_elem_size(dtype) &&
                      (!empty || td->storage_offset == 0) && (!own_strides || !row_major(td));
    torch_extra *x = from_piece ? l->from_piece[td->requires_grad] : NULL;
    if (!x) {
        size_t n = from_piece || !own_strides ? 0 : td->ndim;
        x = arena_alloc_aligned(mem, sizeof *x + n * sizeof *x->strides, _Alignof(torch_extra));
        if (!x) return ckpt_fail(l->err, -ENOMEM, "out of memory");
        x->head.kind = &torch_extra_kind;
        x->file = l->extras;
        x->from_piece = from_piece;
        x->requires_grad = td->requires_grad;
        x->own_strides = n != 0;
        x->storage = (uint32_t)si;
        x->storage_offset = td->storage_offset;
        memcpy(x->strides, td->stride, n * sizeof *x->strides);
        if (from_piece) l->from_piece[td->requires_grad] = x;
    }
    storage *s = &l->storages[si];
    if (s->users == 0) {
        s->first_user = index;
    } else if (s->users == 1) {
        if (GROW(l->more_users, l->cap_more, l->nmore + MAX_SHARED_LISTED))
            return ckpt_fail(l->err, -ENOMEM, "out of memory");
        s->more_at = l->nmore;
        l->nmore += MAX_SHARED_LISTED;
    }
    if (s->users >= 1 && s->users <= MAX_SHARED_LISTED)
        l->more_users[s->more_at + s->users - 1] = index;
    s->users++;
    catalog_set_extra_record(l->cat, index, &x->head);
    return 0;
}

static int add_tensor(loader *l, const pk_value *v) {
    tensor_desc td;
    ckpt_dtype dtype = CKPT_U8;
    uint64_t file_offset = 0;
    size_t si = 0;
    unsigned esz = 0;
    int rc = resolve_tensor(l, v, &td, &dtype, &file_offset, &si, &esz);
    if (rc) return rc;
    const char *name = l->name.data ? l->name.data : "";
    if (l->embedded) return add_embedded(l, v, &td, dtype, file_offset, name);
    /* What catalog_add_tensor would refuse, refused here: in the order of the walk. */
    uint64_t numel, nbytes;
    if (!catalog_shape_nbytes(td.shape, td.ndim, dtype, &numel, &nbytes))
        return ckpt_fail(l->err, -EOVERFLOW,
                         "tensor \"%.*s\": shape product overflows or is not a whole number of "
                         "bytes",
                         SHOWN_NAME(name, l->name.len));
    /* (a name of 4 GiB could only be made of shared keys, and would not fit in memory) */
    if (si > UINT32_MAX || l->name.len > UINT32_MAX || esz > UINT8_MAX ||
        GROW(l->found, l->cap_found, l->nfound + 1))
        return ckpt_fail(l->err, -ENOMEM, "out of memory");
    found_tensor *f = &l->found[l->nfound];
    f->name = l->name_text ? l->name_text : arena_text(&l->scratch, name, l->name.len);
    f->vector = td.ndim == 1 && td.stride[0] == 1;
    if (f->vector) {
        f->u.size = td.shape[0];
    } else if (td.ndim) {
        uint64_t *dims = arena_alloc_aligned(&l->scratch, 2 * td.ndim * sizeof *dims, 8);
        if (!dims) return ckpt_fail(l->err, -ENOMEM, "out of memory");
        memcpy(dims, td.shape, td.ndim * sizeof *dims);
        memcpy(dims + td.ndim, td.stride, td.ndim * sizeof *dims);
        f->u.dims = dims;
    }
    if (!f->name) return ckpt_fail(l->err, -ENOMEM, "out of memory");
    f->name_len = (uint32_t)l->name.len;
    f->storage_offset = td.storage_offset;
    f->storage = (uint32_t)si;
    f->dtype = (uint8_t)dtype;
    f->ndim = (uint8_t)td.ndim;
    f->esz = (uint8_t)esz;
    f->requires_grad = td.requires_grad;
    l->nfound++;
    return 0;
}

/* The tensors the walk found, into the catalog. */
static int add_found(loader *l) {
    int rc = catalog_reserve_tensors(l->cat, l->nfound, l->err);
    if (!rc && l->nfound) rc = start_extras(l);
    for (size_t i = 0; i < l->nfound && !rc; i++) {
        const found_tensor *f = &l->found[i];
        tensor_desc td;
        memset(&td, 0, sizeof td);
        td.ndim = f->ndim;
        if (f->vector) {
            td.shape[0] = f->u.size;
            td.stride[0] = 1;
        } else if (f->ndim) {
            memcpy(td.shape, f->u.dims, f->ndim * sizeof *f->u.dims);
            memcpy(td.stride, f->u.dims + f->ndim, f->ndim * sizeof *f->u.dims);
        }
        td.storage_offset = f->storage_offset;
        td.requires_grad = f->requires_grad;
        /* Where resolve_tensor found element 0 (an empty view: at the storage). */
        bool empty = false;
        for (uint32_t d = 0; d < td.ndim; d++) empty |= td.shape[d] == 0;
        uint64_t file_offset =
            l->storages[f->storage].offset + (empty ? 0 : f->storage_offset * f->esz);
        size_t index;
        rc = catalog_add_tensor(l->cat, f->name, f->name_len, (ckpt_dtype)f->dtype, td.ndim,
                                td.shape, &index, l->err);
        if (!rc)
            rc = catalog_add_piece(l->cat, index, l->source, file_offset, NULL, NULL,
                                   row_major(&td) ? NULL : td.stride, l->err);
        if (!rc) rc = add_extra(l, &td, f->storage, index, f->esz, (ckpt_dtype)f->dtype, empty);
    }
    return rc;
}

/* ---- walking the saved object ---- */

static bool is_tensor(const pk_value *v) {
    if (is_tensor_rec(v)) return true;
    const pk_global *g = pk_call_global(v);
    if (!g) return false;
    switch (g->tag) {
    case PK_G_REBUILD_TENSOR:
    case PK_G_REBUILD_V2:
    case PK_G_REBUILD_V3:
    case PK_G_REBUILD_PARAMETER:
    case PK_G_REBUILD_PARAMETER_STATE:
    case PK_G_REBUILD_FROM_TYPE:
    case PK_G_REBUILD_OTHER:
        return true;
    default:
        return false;
    }
}

static int spend(loader *l, const pk_value *v) {
    if (l->budget) {
        l->budget--;
        return 0;
    }
    return ckpt_fail(l->err, -E2BIG,
                     "%s: the saved object at offset %llu expands beyond the values its pickle "
                     "holds (shared or cyclic references)",
                     l->label, POS(v));
}

/* A list or tuple is walked into (index components) when something inside needs a name of its
 * own: a tensor or a dict. Otherwise it is one metadata value. */
static int has_structure(loader *l, const pk_value *v, int depth, bool *out) {
    *out = false;
    if (depth > MAX_DEPTH) return 0;
    for (uint32_t i = 0; i < v->n && !*out; i++) {
        const pk_value *x = v->u.c.items[i];
        int rc = spend(l, x);
        if (rc) return rc;
        if (x->kind == PK_DICT || is_tensor(x))
            *out = true;
        else if ((x->kind == PK_LIST || x->kind == PK_TUPLE) &&
                 (rc = has_structure(l, x, depth + 1, out)))
            return rc;
    }
    return 0;
}

static int add_meta(loader *l, const pk_value *v) {
    if (l->meta_cut) return 0; /* the warning names the first value left out */
    if (l->embedded)
        sb_puts(&l->meta, l->nmeta++ ? ", " : "");
    else
        sb_puts(&l->meta, l->nmeta++ ? ",\n    " : "\n    ");
    sb_json_str(&l->meta, l->name.data ? l->name.data : "", l->name.len);
    sb_puts(&l->meta, ": ");
    /* One value referenced many times renders many times: the document stops at its limit. */
    size_t room = l->meta.len < CKPT_DOC_LIMIT ? CKPT_DOC_LIMIT - l->meta.len : 0;
    bool cut = false;
    if (!pk_to_json_within(&l->meta, v, &l->budget, room, &cut))
        return ckpt_fail(l->err, -E2BIG,
                         "%s: the value \"%.*s\" at offset %llu expands beyond the values its "
                         "pickle holds (shared or cyclic references)",
                         l->label, -1, shown_name(l), POS(v));
    if (cut) {
        l->meta_cut = true;
        if (!l->embedded)
            catalog_warn(l->cat,
                         "%s: metadata.json shows the pickle's values up to %d MiB: \"%.*s\" is "
                         "truncated and what follows is left out",
                         l->label, CKPT_DOC_LIMIT >> 20, -1, shown_name(l));
    }
    return l->meta.failed ? ckpt_fail(l->err, -ENOMEM, "out of memory") : 0;
}

static int walk(loader *l, const pk_value *v, int depth);

static int walk_child(loader *l, const pk_value *key, uint32_t index, const pk_value *child,
                      int depth) {
    size_t keep = l->name.len;
    const char *keep_text = l->name_text;
    /* A name that is one string key (a flat state dict's) is taken from the pickle as it is. */
    l->name_text = !keep && key && key->kind == PK_STR ? key->u.s.p : NULL;
    if (keep) sb_putc(&l->name, '.');
    if (!key) {
        sb_printf(&l->name, "%u", index);
    } else if (key->kind == PK_STR) {
        sb_put(&l->name, key->u.s.p, key->u.s.len);
    } else if (key->kind == PK_INT) {
        sb_printf(&l->name, "%lld", (long long)key->u.i);
    } else {
        size_t b = 1024;
        bool cut = false;
        if (!pk_to_json_within(&l->name, key, &b, KEY_NAME_MAX, &cut) || cut)
            return ckpt_fail(l->err, -E2BIG,
                             "%s: dict key at offset %llu is too large: its JSON text, which names "
                             "what is under it, passes %d bytes",
                             l->label, POS(key), KEY_NAME_MAX);
    }
    if (l->name.failed) return ckpt_fail(l->err, -ENOMEM, "out of memory");
    int rc = walk(l, child, depth + 1);
    l->name.len = keep;
    l->name_text = keep_text;
    return rc;
}

static int walk(loader *l, const pk_value *v, int depth) {
    int rc = spend(l, v);
    if (rc) return rc;
    if (depth > MAX_DEPTH)
        return ckpt_fail(l->err, -E2BIG,
                         "%s: \"%.*s\" at offset %llu is nested deeper than %d "
                         "levels",
                         l->label, -1, shown_name(l), POS(v), MAX_DEPTH);
    if (is_tensor(v)) {
        if (l->name.len == 0 && !l->embedded) { /* a tensor saved on its own */
            if (l->legacy) {
                const char *base = l->cat->sources[l->source].relpath;
                const char *slash = strrchr(base, '/'), *dot;
                if (slash) base = slash + 1;
                dot = strrchr(base, '.');
                sb_put(&l->name, base, dot && dot != base ? (size_t)(dot - base) : strlen(base));
            } else {
                sb_put(&l->name, l->prefix, l->prefix_len - 1);
            }
            rc = add_tensor(l, v);
            l->name.len = 0;
            return rc;
        }
        return add_tensor(l, v);
    }
    if (pk_call_global(v) && pk_call_global(v)->tag == PK_G_REBUILD_META) {
        catalog_warn(l->cat,
                     "%s: \"%.*s\" is a meta tensor without data; it is only described "
                     "in metadata.json",
                     l->path, -1, shown_name(l));
        return add_meta(l, v);
    }
    if (v->kind == PK_DICT) {
        for (uint32_t i = 0; i < v->n; i++)
            if ((rc = walk_child(l, v->u.c.items[2 * i], 0, v->u.c.items[2 * i + 1], depth)))
                return rc;
        return 0;
    }
    if (v->kind == PK_LIST || v->kind == PK_TUPLE) {
        bool structured;
        if ((rc = has_structure(l, v, depth, &structured))) return rc;
        if (structured) {
            for (uint32_t i = 0; i < v->n; i++)
                if ((rc = walk_child(l, NULL, i, v->u.c.items[i], depth))) return rc;
            return 0;
        }
    }
    return add_meta(l, v);
}

/* ---- sidecar extras, once every tensor is in ---- */

/* The storages' part of the extras, in the catalog's arena: the records point to it. Names are
 * taken now, while the catalog's indexes are the loader's (catalog_finish sorts); their text
 * stays where it is. */
static int set_extras(loader *l) {
    if (!l->extras) return 0;
    arena *mem = &l->cat->priv->mem;
    storage_extra *table = arena_array(mem, l->nstorages ? l->nstorages : 1, sizeof *table);
    if (!table) return ckpt_fail(l->err, -ENOMEM, "out of memory");
    const storage_extra *prev = NULL;
    for (size_t i = 0; i < l->nstorages; i++) {
        const storage *s = &l->storages[i];
        storage_extra *e = &table[i];
        e->key = arena_text(&l->cat->priv->text, s->key, s->key_len);
        e->key_len = s->key_len;
        /* Every storage of a file is on one device, mostly: one copy of its name. */
        if (prev && prev->location_len == s->location_len &&
            memcmp(prev->location, s->location, s->location_len) == 0)
            e->location = prev->location;
        else
            e->location = arena_text(&l->cat->priv->text, s->location, s->location_len);
        e->location_len = s->location_len;
        e->users = s->users;
        e->offset = s->offset;
        if (!e->key || !e->location) return ckpt_fail(l->err, -ENOMEM, "out of memory");
        prev = e;
        if (s->users < 2) continue;
        size_t n = s->users < MAX_SHARED_LISTED + 1 ? s->users : MAX_SHARED_LISTED + 1;
        e->first_names = arena_array(mem, n, sizeof *e->first_names);
        e->first_lens = arena_array(mem, n, sizeof *e->first_lens);
        if (!e->first_names || !e->first_lens) return ckpt_fail(l->err, -ENOMEM, "out of memory");
        for (size_t k = 0; k < n; k++) {
            const ckpt_tensor *t =
                &l->cat->tensors[k ? l->more_users[s->more_at + k - 1] : s->first_user];
            e->first_names[k] = t->name;
            e->first_lens[k] = t->name_len;
        }
    }
    l->extras->storages = table;
    return 0;
}

/* ---- the archive ---- */

static int find_archive(loader *l, const zip_entry **pkl) {
    static const char tail[] = "/data.pkl";
    const size_t tn = sizeof tail - 1;
    *pkl = NULL;
    for (size_t i = 0; i < l->zip.count; i++) {
        const zip_entry *e = &l->zip.entries[i];
        if (e->name_len < tn || memcmp(e->name + e->name_len - tn, tail, tn) != 0) continue;
        if (memchr(e->name, '/', e->name_len - tn)) continue; /* only <archive>/data.pkl */
        if (*pkl)
            return ckpt_fail(l->err, -EINVAL,
                             "%s: two pickles \"%.*s\" and \"%.*s\" (central directory entries at "
                             "offsets %llu and %llu): which one is the checkpoint is ambiguous",
                             l->path, SHOWN_NAME((*pkl)->name, (*pkl)->name_len),
                             SHOWN_NAME(e->name, e->name_len),
                             (unsigned long long)(*pkl)->central_offset,
                             (unsigned long long)e->central_offset);
        *pkl = e;
    }
    if (!*pkl)
        return ckpt_fail(l->err, -EINVAL,
                         "%s: zip has %zu records but no <archive>/data.pkl record (central "
                         "directory at offset %llu): not a torch.save archive",
                         l->path, l->zip.count,
                         (unsigned long long)(l->zip.count ? l->zip.entries[0].central_offset : 0));
    l->prefix = (*pkl)->name;
    l->prefix_len = (*pkl)->name_len - (tn - 1); /* keeps the '/' */
    return 0;
}

/* Reads a small text record <archive>/<name> into buf; false when it is absent. */
static int small_record(loader *l, const char *name, char *buf, size_t size, bool *present) {
    *present = false;
    char full[700];
    int n = snprintf(full, sizeof full, "%.*s%s", (int)l->prefix_len, l->prefix, name);
    if (n < 0 || (size_t)n >= sizeof full) return 0;
    const zip_entry *e = zip_find(&l->zip, full, (size_t)n);
    if (!e) return 0;
    char *data;
    size_t len;
    int rc = zip_read(&l->zip, e, size - 1, &data, &len, l->err);
    if (rc) return rc;
    memcpy(buf, data, len + 1);
    free(data);
    *present = true;
    return 0;
}

static int check_records(loader *l, strbuf *doc) {
    char buf[64];
    bool present;
    int rc = small_record(l, "byteorder", buf, sizeof buf, &present);
    if (rc) return rc;
    if (present) {
        if (strcmp(buf, "big") == 0)
            return ckpt_fail(l->err, -ENOTSUP,
                             "%s: record \"%.*sbyteorder\" says \"big\": big-endian torch files "
                             "are not supported (load and re-save on a little-endian machine)",
                             l->path, (int)l->prefix_len, l->prefix);
        if (strcmp(buf, "little") != 0)
            return ckpt_fail(l->err, -EINVAL,
                             "%s: record \"%.*sbyteorder\" holds \"%.16s\", not \"little\" or "
                             "\"big\"",
                             l->path, (int)l->prefix_len, l->prefix, buf);
        sb_puts(doc, ", \"byteorder\": \"little\"");
    }
    for (const char *const *name = (const char *const[]){"version", ".data/version", NULL}; *name;
         name++) {
        if ((rc = small_record(l, *name, buf, sizeof buf, &present))) return rc;
        if (!present) continue;
        char *end;
        long v = strtol(buf, &end, 10);
        if (end == buf || (*end && *end != '\n') || v < 1 || v > 10)
            return ckpt_fail(l->err, -EINVAL,
                             "%s: record \"%.*s%s\" holds \"%.16s\", not a format version from 1 "
                             "to 10",
                             l->path, (int)l->prefix_len, l->prefix, *name, buf);
        sb_printf(doc, ", \"version\": %ld", v);
        break;
    }
    return 0;
}

/* The parse's hook: a dict's tensor that reads cleanly becomes a record at once, so a state
 * dict never stands whole as a tree. One that does not stays a call, and the walk says what is
 * wrong with it, in the order it always has. */
static int on_pair(void *ctx, pk_doc *doc, const pk_pair_site *site, pk_value **key,
                   pk_value **value, ckpt_err *err) {
    (void)site;
    (void)key;
    loader *l = ctx;
    const pk_global *g = pk_call_global(*value);
    if (!g || !is_tensor(*value) || g->tag == PK_G_REBUILD_OTHER) return 0;
    ckpt_err quiet, *keep = l->err;
    l->err = &quiet;
    tensor_desc td;
    bool clean =
        read_tensor(l, *value, &td) == 0 &&
        (!td.has_dtype || (td.dtype_g && td.dtype_g->tag == PK_G_DTYPE && td.dtype_g->dtype >= 0));
    l->err = keep;
    /* Offsets come before the call that uses them; a record keeps their distances in 32 bits. */
    if (!clean || td.ref.pos > td.pos || td.pos - td.ref.pos > UINT32_MAX ||
        (td.has_dtype && td.dtype_pos > td.pos))
        return 0;
    const shared_ref *last = l->last_ref;
    const shared_ref *id = &td.ref.id;
    if (!last || last->cls != id->cls || last->numel != id->numel || last->key_len != id->key_len ||
        last->location_len != id->location_len || memcmp(last->key, id->key, id->key_len) != 0 ||
        memcmp(last->location, id->location, id->location_len) != 0) {
        shared_ref *ref = arena_alloc(&doc->mem, sizeof *ref);
        if (!ref) return ckpt_fail(err, -ENOMEM, "out of memory");
        *ref = *id;
        l->last_ref = last = ref;
    }
    size_t dims = 2 * (size_t)td.ndim * sizeof(uint64_t);
    tensor_rec *r =
        arena_alloc(&doc->mem, sizeof *r + dims + (td.has_dtype ? sizeof(rec_dtype) : 0));
    pk_value *rec = r ? pk_new_record(doc, REC_TENSOR, r, td.pos) : NULL;
    if (!rec) return ckpt_fail(err, -ENOMEM, "out of memory");
    r->ref = last;
    r->storage_offset = td.storage_offset;
    r->persid_back = (uint32_t)(td.pos - td.ref.pos);
    r->ndim = (uint8_t)td.ndim;
    r->has_dtype = td.has_dtype;
    r->requires_grad = td.requires_grad;
    memcpy(r->dims, td.shape, td.ndim * sizeof *r->dims);
    memcpy(r->dims + td.ndim, td.stride, td.ndim * sizeof *r->dims);
    if (td.has_dtype) {
        rec_dtype dt = {td.dtype_g, td.pos - td.dtype_pos};
        memcpy(r->dims + 2 * td.ndim, &dt, sizeof dt);
    }
    *value = rec;
    l->records++;
    return 0;
}

/* Walks the saved object into tensors and metadata; `doc` is the open "torch" document. */
static int finish(loader *l, pk_doc *pd, strbuf *doc) {
    /* Shared values (tied weights) are visited once per reference: allow a few passes. */
    l->budget = 4 * pd->values + 1024;
    /* The walk finds about as many tensors as the parse made records. */
    int rc = 0;
    if (!l->embedded && l->records > l->cap_found) {
        found_tensor *f = realloc(l->found, l->records * sizeof *f);
        if (!f) return ckpt_fail(l->err, -ENOMEM, "out of memory");
        l->found = f;
        l->cap_found = l->records;
    }
    rc = walk(l, pd->root, 0);
    pk_free(pd); /* before the catalog is filled: the two would add up */
    if (rc || l->embedded) return rc;
    rc = add_found(l);
    if (!rc) rc = set_extras(l);
    if (!rc) {
        sb_printf(doc, ", \"storages\": %zu, \"tensors\": %zu}", l->nstorages, l->nfound);
        rc = doc->failed ? ckpt_fail(l->err, -ENOMEM, "out of memory")
                         : catalog_add_doc(l->cat, "torch", doc->data, doc->len, l->err);
    }
    if (!rc) {
        sb_puts(&l->meta, l->nmeta ? "\n  }" : "}");
        rc = l->meta.failed ? ckpt_fail(l->err, -ENOMEM, "out of memory")
                            : catalog_add_doc(l->cat, "pickle", l->meta.data, l->meta.len, l->err);
    }
    return rc;
}

static int load_zip(loader *l, strbuf *doc) {
    int rc = zip_open(&l->zip, l->cat, l->source, l->base, l->length, l->path, l->err);
    if (rc) return rc;
    const zip_entry *pkl;
    if ((rc = find_archive(l, &pkl))) return rc;
    snprintf(l->label, sizeof l->label, "%s: %.*s", l->path, SHOWN_NAME(pkl->name, pkl->name_len));
    sb_puts(doc, "{\"archive\": ");
    sb_json_str(doc, l->prefix, l->prefix_len - 1);
    if ((rc = check_records(l, doc))) return rc;
    uint64_t pkl_offset = 0;
    char *data = NULL;
    size_t len = 0;
    if (!(rc = zip_data_offset(&l->zip, pkl, &pkl_offset, l->err)))
        rc = zip_map(&l->zip, pkl, PICKLE_LIMIT, &data, &len, l->err);
    pk_doc pd = {0};
    if (!rc) {
        const pk_table tables[2] = {pk_torch_globals,
                                    l->extra_globals ? *l->extra_globals : pk_torch_globals};
        pk_hooks hooks = {l, on_pair};
        pk_options opt = {l->label,  pkl_offset, tables, l->extra_globals ? 2 : 1,
                          {0, 0, 0}, &hooks};
        l->last_ref = NULL;
        rc = pk_parse(&pd, data, len, &opt, l->err);
    }
    if (!rc) {
        rc = finish(l, &pd, doc);
        /* Storage keys point into the pickle: drop the map before the buffer. */
        hm_free(&l->storage_by_key);
        pk_free(&pd);
    }
    zip_unmap(data, len);
    return rc;
}

/* ---- the legacy format: magic, protocol version, sys_info, object, storage keys, storages ---- */

/* Element size and count of every storage the object references, from its persistent ids
 * ("storage", class, key, location, numel, view_metadata). */
static int collect_legacy_storages(loader *l, const pk_value *v, int depth, size_t *n,
                                   size_t *cap) {
    int rc = spend(l, v);
    if (rc || depth > MAX_DEPTH) return rc;
    const char *key;
    size_t key_len;
    unsigned esz;
    switch ((pk_kind)v->kind) {
    case PK_RECORD:
    case PK_PERSID: {
        if (is_tensor_rec(v)) {
            const tensor_rec *r = v->u.record;
            key = r->ref->key;
            key_len = r->ref->key_len;
            esz = r->ref->cls->esz;
        } else if (v->kind == PK_PERSID) {
            const pk_value *id = v->u.persid;
            if (id->kind != PK_TUPLE || id->n < 5 || id->u.c.items[1]->kind != PK_GLOBAL ||
                id->u.c.items[2]->kind != PK_STR || id->u.c.items[4]->kind != PK_INT)
                return 0; /* find_storage explains what is wrong, if a tensor uses it */
            key = id->u.c.items[2]->u.s.p;
            key_len = id->u.c.items[2]->u.s.len;
            esz = id->u.c.items[1]->u.global->esz;
        } else {
            return 0;
        }
        bool added;
        hm_entry *he = hm_put(&l->legacy_by_key, key, key_len, *n, &added);
        if (!he) return ckpt_fail(l->err, -ENOMEM, "out of memory");
        if (!added) return 0;
        if (GROW(l->legacy_storages, *cap, *n + 1))
            return ckpt_fail(l->err, -ENOMEM, "out of memory");
        legacy_storage *ls = &l->legacy_storages[(*n)++];
        ls->esz = esz;
        ls->numel = UINT64_MAX; /* not found in the storage section yet */
        ls->offset = 0;
        return 0;
    }
    case PK_TUPLE:
    case PK_LIST:
    case PK_SET:
    case PK_DICT: {
        uint32_t items = v->kind == PK_DICT ? 2 * v->n : v->n;
        for (uint32_t i = 0; i < items && !rc; i++)
            rc = collect_legacy_storages(l, v->u.c.items[i], depth + 1, n, cap);
        return rc;
    }
    case PK_CALL:
        rc = collect_legacy_storages(l, v->u.call.args, depth + 1, n, cap);
        if (!rc && v->u.call.state)
            rc = collect_legacy_storages(l, v->u.call.state, depth + 1, n, cap);
        return rc;
    default:
        return 0;
    }
}

/* Parses the five leading pickles from a window of the file that grows until they fit. */
static int legacy_pickles(loader *l, char **buf, pk_doc pd[5]) {
    uint64_t size = l->cat->sources[l->source].size;
    uint64_t limit = size < PICKLE_LIMIT ? size : PICKLE_LIMIT;
    static const char *const what[5] = {"magic number", "protocol version", "sys_info",
                                        "saved object", "storage key list"};
    for (uint64_t window = limit < (1u << 20) ? limit : (1u << 20);; window *= 2) {
        if (window > limit) window = limit;
        free(*buf);
        if (!(*buf = malloc(window ? (size_t)window : 1)))
            return ckpt_fail(l->err, -ENOMEM, "out of memory");
        int rc = ckpt_source_read(l->cat, l->source, 0, *buf, (size_t)window, "pickles", l->err);
        if (rc) return rc;
        size_t at = 0;
        int i;
        l->records = 0; /* a retry parses them all again */
        for (i = 0; i < 5 && !rc; i++) {
            snprintf(l->label, sizeof l->label, "%s: %s pickle", l->path, what[i]);
            pk_hooks hooks = {l, on_pair};
            pk_options opt = {l->label, at, &pk_torch_globals, 1, {0, 0, 0}, &hooks};
            l->last_ref = NULL; /* each pickle's records live in its own document */
            rc = pk_parse(&pd[i], *buf + at, (size_t)window - at, &opt, l->err);
            if (!rc) at += pd[i].end;
        }
        if (!rc) return 0;
        for (int j = 0; j < i - 1; j++) pk_free(&pd[j]);
        if (rc != PK_ETRUNC || window == limit) return rc;
    }
}

static int load_legacy(loader *l, strbuf *doc) {
    char *buf = NULL;
    pk_doc pd[5];
    memset(pd, 0, sizeof pd);
    int rc = legacy_pickles(l, &buf, pd);
    if (rc) {
        free(buf);
        return rc;
    }
    const pk_value *version = pd[1].root, *info = pd[2].root, *keys = pd[4].root;
    const pk_value *little = pk_dict_get(info, "little_endian");
    uint64_t at = pd[0].end + pd[1].end + pd[2].end + pd[3].end + pd[4].end;
    uint64_t size = l->cat->sources[l->source].size;
    if (version->kind != PK_INT || version->u.i != 1001)
        rc = ckpt_fail(l->err, -EINVAL, "%s: legacy protocol version at offset %llu is not 1001",
                       l->path, POS(version));
    else if (!little || little->kind != PK_BOOL)
        rc = ckpt_fail(l->err, -EINVAL,
                       "%s: sys_info at offset %llu has no boolean \"little_endian\"", l->path,
                       POS(info));
    else if (!little->u.b)
        rc = ckpt_fail(l->err, -ENOTSUP,
                       "%s: sys_info at offset %llu says the file is big-endian, which is not "
                       "supported",
                       l->path, POS(info));
    else if (keys->kind != PK_LIST)
        rc = ckpt_fail(l->err, -EINVAL, "%s: storage key list at offset %llu is a %s, not a list",
                       l->path, POS(keys), pk_kind_name(keys->kind));
    size_t n = 0, cap = 0;
    if (!rc && !hm_init(&l->legacy_by_key, 64)) rc = ckpt_fail(l->err, -ENOMEM, "out of memory");
    if (!rc) {
        snprintf(l->label, sizeof l->label, "%s: saved object pickle", l->path);
        l->budget = 4 * pd[3].values + 1024;
        rc = collect_legacy_storages(l, pd[3].root, 0, &n, &cap);
    }
    /* The storages follow in key-list order: an 8-byte element count, then the bytes. */
    for (uint32_t i = 0; !rc && i < keys->n; i++) {
        const pk_value *k = keys->u.c.items[i];
        if (k->kind != PK_STR) {
            rc = ckpt_fail(l->err, -EINVAL,
                           "%s: storage key list entry %u at offset %llu is not a "
                           "string",
                           l->path, i, POS(k));
            break;
        }
        const hm_entry *he = hm_get(&l->legacy_by_key, k->u.s.p, k->u.s.len);
        if (!he) {
            rc = ckpt_fail(l->err, -EINVAL,
                           "%s: storage \"%.*s\" (key list entry %u) is used by no tensor, so "
                           "its element size and the offset of the next storage are unknown",
                           l->path, SHOWN_NAME(k->u.s.p, k->u.s.len), i);
            break;
        }
        legacy_storage *ls = &l->legacy_storages[he->value];
        unsigned char cnt[8];
        uint64_t bytes;
        if (ls->numel != UINT64_MAX) {
            rc = ckpt_fail(l->err, -EINVAL, "%s: storage \"%.*s\" is listed twice in the key list",
                           l->path, SHOWN_NAME(k->u.s.p, k->u.s.len));
        } else if (!(rc = ckpt_source_read(l->cat, l->source, at, cnt, 8, "storage element count",
                                           l->err))) {
            uint64_t numel = le64(cnt);
            if (__builtin_mul_overflow(numel, (uint64_t)ls->esz, &bytes) || bytes > size - at - 8)
                rc = ckpt_fail(l->err, -EINVAL,
                               "%s: storage \"%.*s\": element count %llu at offset %llu runs past "
                               "the end of the file (size %llu)",
                               l->path, SHOWN_NAME(k->u.s.p, k->u.s.len), (unsigned long long)numel,
                               (unsigned long long)at, (unsigned long long)size);
            ls->numel = numel;
            ls->offset = at + 8;
            at += 8 + bytes;
        }
    }
    if (!rc) {
        l->legacy = true;
        snprintf(l->label, sizeof l->label, "%s: saved object pickle", l->path);
        sb_puts(doc, "{\"format\": \"legacy\", \"protocol_version\": 1001");
        rc = finish(l, &pd[3], doc);
    }
    hm_free(&l->storage_by_key);
    hm_free(&l->legacy_by_key);
    for (int i = 0; i < 5; i++) pk_free(&pd[i]);
    free(buf);
    return rc;
}

/* Reads the file (or the embedded zip) l describes; l->name holds the root's name. */
static int run(loader *l, bool legacy) {
    strbuf doc;
    sb_init(&doc);
    if (!l->embedded) sb_putc(&l->meta, '{');
    if (!hm_init(&l->storage_by_key, 64)) return ckpt_fail(l->err, -ENOMEM, "out of memory");
    int rc = legacy ? load_legacy(l, &doc) : load_zip(l, &doc);
    hm_free(&l->storage_by_key);
    hm_free(&l->legacy_by_key);
    zip_close(&l->zip);
    free(l->storages);
    free(l->found);
    arena_free(&l->scratch);
    free(l->more_users);
    free(l->legacy_storages);
    sb_free(&doc);
    sb_free(&l->name);
    return rc;
}

static int load(ckpt_catalog *cat, uint32_t source, ckpt_err *err) {
    loader l;
    memset(&l, 0, sizeof l);
    l.cat = cat;
    l.source = source;
    l.path = cat->sources[source].path;
    l.err = err;
    l.length = cat->sources[source].size;
    snprintf(l.label, sizeof l.label, "%s", l.path);
    unsigned char head[sizeof legacy_magic];
    uint64_t size = cat->sources[source].size;
    size_t n = size < sizeof head ? (size_t)size : sizeof head;
    int rc = ckpt_source_read(cat, source, 0, head, n, "magic", err);
    if (rc) return rc;
    bool legacy = n == sizeof head && memcmp(head, legacy_magic, sizeof head) == 0;
    sb_init(&l.name);
    sb_init(&l.meta);
    rc = run(&l, legacy);
    sb_free(&l.meta);
    return rc;
}

void torch_embedded_free(torch_embedded *e) {
    for (size_t i = 0; i < e->ntensors; i++) free(e->tensors[i].name);
    free(e->tensors);
    free(e->values);
    memset(e, 0, sizeof *e);
}

int torch_zip_read_embedded(ckpt_catalog *cat, uint32_t source, uint64_t offset, uint64_t length,
                            const char *label, const char *root_name, size_t root_len,
                            torch_embedded *out, ckpt_err *err) {
    return torch_zip_read_with(cat, source, offset, length, label, root_name, root_len, NULL, out,
                               err);
}

int torch_zip_read_with(ckpt_catalog *cat, uint32_t source, uint64_t offset, uint64_t length,
                        const char *label, const char *root_name, size_t root_len,
                        const pk_table *extra_globals, torch_embedded *out, ckpt_err *err) {
    memset(out, 0, sizeof *out);
    unsigned char head[4];
    int rc = length < 4 ? 0 : ckpt_source_read(cat, source, offset, head, 4, "zip magic", err);
    if (rc) return rc;
    if (length < 4 || memcmp(head, "PK\3\4", 4) != 0)
        return ckpt_fail(err, -EINVAL,
                         "%s: the %llu bytes at offset %llu do not start with a zip local header "
                         "(PK\\3\\4): not a torch.save archive",
                         label, (unsigned long long)length, (unsigned long long)offset);
    loader l;
    memset(&l, 0, sizeof l);
    l.cat = cat;
    l.source = source;
    l.path = label;
    l.err = err;
    l.base = offset;
    l.length = length;
    l.embedded = out;
    l.extra_globals = extra_globals;
    snprintf(l.label, sizeof l.label, "%s", label);
    sb_init(&l.name);
    sb_init(&l.meta);
    sb_put(&l.name, root_name, root_len);
    rc = l.name.failed ? ckpt_fail(err, -ENOMEM, "out of memory") : run(&l, false);
    sb_free(&l.name); /* run() freed it already, unless it never ran */
    if (!rc && l.meta.failed) rc = ckpt_fail(err, -ENOMEM, "out of memory");
    if (rc) {
        sb_free(&l.meta);
        torch_embedded_free(out);
        return rc;
    }
    out->nvalues = l.nmeta;
    out->values = sb_take(&l.meta, &out->values_len);
    if (!out->values) {
        out->values_len = 0;
        if (!(out->values = calloc(1, 1))) {
            torch_embedded_free(out);
            return ckpt_fail(err, -ENOMEM, "out of memory");
        }
    }
    return 0;
}

const ckpt_format format_torch_zip = {
    .name = "torch-zip",
    .label = "torch zip",
    .probe = probe,
    .load = load,
    .integrity = "structure; the CRC-32 of every zip record is checked by verify",
};
