#include "catalog.h"
#include "../util/grow.h"
#include "../util/pipeline.h"
#include "../io/remote/remote.h"
#include "../io/source.h"
#include "st_names.h"
#include "../util/utf8.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

ckpt_catalog *catalog_new(const char *root, const char *format) {
    ckpt_catalog *cat = calloc(1, sizeof *cat);
    if (!cat) return NULL;
    cat->priv = calloc(1, sizeof *cat->priv);
    if (!cat->priv) {
        free(cat);
        return NULL;
    }
    arena_init(&cat->priv->mem);
    arena_init(&cat->priv->text);
    cat->format = format;
    cat->root = arena_strdup(&cat->priv->mem, root);
    if (!cat->root) {
        ckpt_close(cat);
        return NULL;
    }
    return cat;
}

void ckpt_close(ckpt_catalog *cat) {
    if (!cat) return;
    for (uint32_t i = 0; i < cat->nsources; i++) source_close(&cat->sources[i]);
    for (size_t i = 0; i < cat->ntensors; i++) planner_piece_index_free(cat->tensors[i].index);
    free(cat->sources);
    free(cat->tensors);
    free(cat->docs);
    free(cat->aux);
    free(cat->warnings);
    if (cat->priv) {
        free(cat->priv->pieces);
        free(cat->priv->tsv);
        arena_free(&cat->priv->mem);
        arena_free(&cat->priv->text);
        free(cat->priv);
    }
    free(cat);
}

int catalog_add_source(ckpt_catalog *cat, const char *path, const char *relpath, uint32_t *index,
                       ckpt_err *err) {
    struct ckpt_catalog_private *pv = cat->priv;
    if (cat->nsources == UINT32_MAX) return ckpt_fail(err, -EMFILE, "%s: too many files", path);
    if (GROW(cat->sources, pv->cap_sources, cat->nsources + 1))
        return ckpt_fail(err, -ENOMEM, "out of memory");
    ckpt_source *s = &cat->sources[cat->nsources];
    char shown[PATH_MAX];
    int rc = source_open(s, path, shown, sizeof shown, err);
    if (rc) return rc;
    s->path = arena_strdup(&pv->mem, s->remote ? shown : path);
    s->relpath = arena_strdup(&pv->mem, relpath);
    if (!s->path || !s->relpath) {
        source_close(s);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    *index = cat->nsources++;
    return 0;
}

int catalog_add_virtual_source(ckpt_catalog *cat, const char *name, uint64_t size,
                               const ckpt_virtual_ops *ops, void *ctx, uint32_t *index,
                               ckpt_err *err) {
    struct ckpt_catalog_private *pv = cat->priv;
    if (cat->nsources == UINT32_MAX) return ckpt_fail(err, -EMFILE, "too many files");
    if (GROW(cat->sources, pv->cap_sources, cat->nsources + 1))
        return ckpt_fail(err, -ENOMEM, "out of memory");
    ckpt_source *s = &cat->sources[cat->nsources];
    source_open_virtual(s, size, ops, ctx);
    s->path = s->relpath = arena_strdup(&pv->mem, name);
    if (!s->path) return ckpt_fail(err, -ENOMEM, "out of memory");
    *index = cat->nsources++;
    return 0;
}

int catalog_add_member(ckpt_catalog *cat, uint32_t archive, const char *name, uint64_t base,
                       uint64_t size, uint32_t *index, ckpt_err *err) {
    struct ckpt_catalog_private *pv = cat->priv;
    if (cat->nsources == UINT32_MAX)
        return ckpt_fail(err, -EMFILE, "%s: too many files", cat->sources[archive].path);
    if (GROW(cat->sources, pv->cap_sources, cat->nsources + 1))
        return ckpt_fail(err, -ENOMEM, "out of memory");
    ckpt_source *s = &cat->sources[cat->nsources];
    int rc = source_open_member(s, &cat->sources[archive], name, base, size, err);
    if (rc) return rc;
    s->relpath = arena_strdup(&pv->mem, name);
    if (!s->relpath) {
        source_close(s);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    *index = cat->nsources++;
    return 0;
}

bool catalog_shape_nbytes(const uint64_t *shape, uint32_t ndim, ckpt_dtype dt, uint64_t *numel,
                          uint64_t *nbytes) {
    uint64_t n = 1;
    for (uint32_t i = 0; i < ndim; i++)
        if (__builtin_mul_overflow(n, shape[i], &n)) return false;
    const ckpt_dtype_info *info = ckpt_dtype_info_of(dt);
    if (n % info->block) return false; /* a partial block (or byte, for F4/F6) */
    uint64_t bytes;
    if (__builtin_mul_overflow(n / info->block, (uint64_t)info->block_bytes, &bytes)) return false;
    *numel = n;
    *nbytes = bytes;
    return true;
}

_Static_assert(sizeof(ckpt_tensor) <= 96, "ckpt_tensor grew: a million of them are held");

int catalog_reserve_tensors(ckpt_catalog *cat, size_t n, ckpt_err *err) {
    struct ckpt_catalog_private *pv = cat->priv;
    if (n > SIZE_MAX / sizeof *cat->tensors - cat->ntensors)
        return ckpt_fail(err, -ENOMEM, "out of memory");
    size_t need = cat->ntensors + n;
    if (need <= pv->cap_tensors) return 0;
    ckpt_tensor *t = realloc(cat->tensors, need * sizeof *t);
    if (!t) return ckpt_fail(err, -ENOMEM, "out of memory");
    cat->tensors = t;
    pv->cap_tensors = need;
    return 0;
}

int catalog_add_tensor(ckpt_catalog *cat, const char *name, size_t name_len, ckpt_dtype dtype,
                       uint32_t ndim, const uint64_t *shape, size_t *index, ckpt_err *err) {
    struct ckpt_catalog_private *pv = cat->priv;
    if (ndim > CKPT_MAX_DIMS)
        return ckpt_fail(err, -EINVAL, "tensor \"%.*s\": %u dimensions (at most %d supported)",
                         SHOWN_NAME(name, name_len), ndim, CKPT_MAX_DIMS);
    if (GROW(cat->tensors, pv->cap_tensors, cat->ntensors + 1))
        return ckpt_fail(err, -ENOMEM, "out of memory");
    ckpt_tensor *t = &cat->tensors[cat->ntensors];
    memset(t, 0, sizeof *t);
    t->name = arena_text(&pv->text, name, name_len);
    t->name_len = name_len;
    t->dtype = dtype;
    t->ndim = ndim;
    t->shape = arena_alloc_aligned(&pv->mem, (ndim ? ndim : 1) * sizeof *t->shape, 8);
    if (!t->name || !t->shape) return ckpt_fail(err, -ENOMEM, "out of memory");
    if (ndim) memcpy(t->shape, shape, ndim * sizeof *shape);
    if (!catalog_shape_nbytes(t->shape, ndim, dtype, &t->numel, &t->nbytes))
        return ckpt_fail(err, -EOVERFLOW,
                         "tensor \"%.*s\": shape product overflows or is not "
                         "a whole number of bytes",
                         SHOWN_NAME(name, name_len));
    *index = cat->ntensors++;
    return 0;
}

int catalog_add_piece(ckpt_catalog *cat, size_t index, uint32_t source, uint64_t file_offset,
                      const uint64_t *offsets, const uint64_t *sizes, const uint64_t *strides,
                      ckpt_err *err) {
    struct ckpt_catalog_private *pv = cat->priv;
    ckpt_tensor *t = &cat->tensors[index];
    ckpt_piece piece = {.source = source, .file_offset = file_offset};
    uint32_t nd = t->ndim;
    /* A piece at the origin shares one array of zeros, and a whole one its tensor's shape (set
     * in attach_pieces: a decoder may still grow the shape): at a million tensors of one piece
     * each, copies of both cost 32 MB. */
    if (nd && offsets) {
        piece.offsets = arena_alloc_aligned(&pv->mem, nd * sizeof(uint64_t), 8);
        if (!piece.offsets) return ckpt_fail(err, -ENOMEM, "out of memory");
        memcpy(piece.offsets, offsets, nd * sizeof(uint64_t));
    } else if (nd) {
        if (!pv->zeros && !(pv->zeros = arena_array(&pv->mem, CKPT_MAX_DIMS, sizeof(uint64_t))))
            return ckpt_fail(err, -ENOMEM, "out of memory");
        piece.offsets = pv->zeros;
    }
    if (nd && sizes) {
        piece.sizes = arena_alloc_aligned(&pv->mem, nd * sizeof(uint64_t), 8);
        if (!piece.sizes) return ckpt_fail(err, -ENOMEM, "out of memory");
        memcpy(piece.sizes, sizes, nd * sizeof(uint64_t));
    }
    if (nd && strides) {
        piece.strides = arena_alloc_aligned(&pv->mem, nd * sizeof(uint64_t), 8);
        if (!piece.strides) return ckpt_fail(err, -ENOMEM, "out of memory");
        memcpy(piece.strides, strides, nd * sizeof(uint64_t));
    }
    /* A tensor's first piece goes straight to it, the others wait for attach_pieces: most
     * tensors have one, and the pending list cost 48 bytes each until catalog_finish. */
    if (!t->npieces) {
        if (!(t->pieces = arena_alloc_aligned(&pv->mem, sizeof *t->pieces, 8)))
            return ckpt_fail(err, -ENOMEM, "out of memory");
        t->pieces[0] = piece;
        t->npieces = 1;
        return 0;
    }
    if (GROW(pv->pieces, pv->cap_pieces, pv->npieces + 1))
        return ckpt_fail(err, -ENOMEM, "out of memory");
    pv->pieces[pv->npieces++] = (pending_piece){.tensor = index, .piece = piece};
    return 0;
}

int catalog_copy_pieces(ckpt_catalog *cat, size_t from, size_t to, ckpt_err *err) {
    struct ckpt_catalog_private *pv = cat->priv;
    size_t pending = pv->npieces; /* the pieces added here are not copied again */
    int rc = 0;
    if (cat->tensors[from].npieces) {
        ckpt_piece p = cat->tensors[from].pieces[0];
        rc =
            catalog_add_piece(cat, to, p.source, p.file_offset, p.offsets, p.sizes, p.strides, err);
    }
    for (size_t i = 0; i < pending && !rc; i++) {
        pending_piece pp = pv->pieces[i];
        if (pp.tensor == from)
            rc = catalog_add_piece(cat, to, pp.piece.source, pp.piece.file_offset, pp.piece.offsets,
                                   pp.piece.sizes, pp.piece.strides, err);
    }
    return rc;
}

int catalog_set_prefix(ckpt_catalog *cat, size_t index, const char *prefix, bool aside,
                       ckpt_err *err) {
    cat->tensors[index].aside = aside;
    cat->tensors[index].prefix = arena_strdup(&cat->priv->mem, prefix);
    return cat->tensors[index].prefix ? 0 : ckpt_fail(err, -ENOMEM, "out of memory");
}

/* Extras set as text: the text follows the header. */
typedef struct text_extra {
    ckpt_extra head;
    char text[];
} text_extra;

static void render_text(const ckpt_extra *x, const ckpt_tensor *t, strbuf *sb) {
    (void)t;
    sb_puts(sb, ((const text_extra *)x)->text);
}

static const ckpt_extra_kind text_kind = {render_text};

int catalog_set_extra(ckpt_catalog *cat, size_t index, const char *json_members, ckpt_err *err) {
    size_t n = strlen(json_members);
    text_extra *x = arena_alloc_aligned(&cat->priv->mem, sizeof *x + n + 1, _Alignof(text_extra));
    if (!x) return ckpt_fail(err, -ENOMEM, "out of memory");
    x->head.kind = &text_kind;
    memcpy(x->text, json_members, n + 1);
    cat->tensors[index].extra = &x->head;
    return 0;
}

void catalog_set_extra_record(ckpt_catalog *cat, size_t index, const ckpt_extra *extra) {
    cat->tensors[index].extra = extra;
}

bool ckpt_tensor_extra(const ckpt_tensor *t, strbuf *sb) {
    if (!t->extra) return false;
    t->extra->kind->render(t->extra, t, sb);
    return true;
}

int catalog_set_summary_extra(ckpt_catalog *cat, const char *json_members, ckpt_err *err) {
    cat->summary_extra = arena_strdup(&cat->priv->mem, json_members);
    return cat->summary_extra ? 0 : ckpt_fail(err, -ENOMEM, "out of memory");
}

int catalog_prefix_docs(ckpt_catalog *cat, size_t first, const char *prefix, ckpt_err *err) {
    for (size_t i = first; i < cat->ndocs; i++) {
        size_t a = strlen(prefix), b = strlen(cat->docs[i].key);
        char *k = arena_alloc(&cat->priv->mem, a + b + 2);
        if (!k) return ckpt_fail(err, -ENOMEM, "out of memory");
        memcpy(k, prefix, a);
        k[a] = '/';
        memcpy(k + a + 1, cat->docs[i].key, b + 1);
        cat->docs[i].key = k;
    }
    return 0;
}

int catalog_add_doc(ckpt_catalog *cat, const char *key, const char *json, size_t len,
                    ckpt_err *err) {
    struct ckpt_catalog_private *pv = cat->priv;
    if (GROW(cat->docs, pv->cap_docs, cat->ndocs + 1))
        return ckpt_fail(err, -ENOMEM, "out of memory");
    ckpt_doc *d = &cat->docs[cat->ndocs];
    char marker[160];
    if (len > CKPT_METADATA_LIMIT - pv->docs_bytes) {
        if (catalog_warn(cat,
                         "metadata.json leaves out the document \"%.100s\" (%zu bytes): its "
                         "documents are limited to %d MiB",
                         key, len, CKPT_METADATA_LIMIT >> 20))
            return ckpt_fail(err, -ENOMEM, "out of memory");
        len = (size_t)snprintf(marker, sizeof marker,
                               "{\"truncated\": \"a document of %zu bytes, past the limit of "
                               "%d MiB\"}",
                               len, CKPT_METADATA_LIMIT >> 20);
        json = marker;
    } else {
        pv->docs_bytes += len;
    }
    d->key = arena_strdup(&pv->mem, key);
    d->json = arena_memdup(&pv->mem, json, len);
    d->len = len;
    if (!d->key || !d->json) return ckpt_fail(err, -ENOMEM, "out of memory");
    cat->ndocs++;
    return 0;
}

int catalog_add_aux(ckpt_catalog *cat, const char *name, uint32_t source, ckpt_err *err) {
    struct ckpt_catalog_private *pv = cat->priv;
    if (GROW(cat->aux, pv->cap_aux, cat->naux + 1)) return ckpt_fail(err, -ENOMEM, "out of memory");
    cat->aux[cat->naux].name = arena_strdup(&pv->mem, name);
    cat->aux[cat->naux].source = source;
    if (!cat->aux[cat->naux].name) return ckpt_fail(err, -ENOMEM, "out of memory");
    cat->naux++;
    return 0;
}

int catalog_warn(ckpt_catalog *cat, const char *fmt, ...) {
    struct ckpt_catalog_private *pv = cat->priv;
    if (GROW(cat->warnings, pv->cap_warnings, cat->nwarnings + 1)) return -ENOMEM;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    char *w = arena_strdup(&pv->mem, buf);
    if (!w) return -ENOMEM;
    cat->warnings[cat->nwarnings++] = w;
    return 0;
}

/* Unprefixed tensors first, then by prefix; by name within each. */
static int name_cmp(const void *a, const void *b) {
    const ckpt_tensor *x = a, *y = b;
    if (x->prefix != y->prefix) {
        if (!x->prefix || !y->prefix) return x->prefix ? 1 : -1;
        int c = strcmp(x->prefix, y->prefix);
        if (c) return c;
    }
    size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
    int c = memcmp(x->name, y->name, n);
    if (c) return c;
    return (x->name_len > y->name_len) - (x->name_len < y->name_len);
}

/* Attaches pending pieces to their tensors, keeping the order they were added in (the first of
 * several replicas is the one served). Counting sort: O(pieces + tensors). */
static int attach_pieces(ckpt_catalog *cat, ckpt_err *err) {
    struct ckpt_catalog_private *pv = cat->priv;
    /* extra[t]: the pending pieces of tensor t, counted in npieces first. */
    for (size_t i = 0; i < pv->npieces; i++) {
        ckpt_tensor *t = &cat->tensors[pv->pieces[i].tensor];
        if (t->npieces == UINT32_MAX) return ckpt_fail(err, -EINVAL, "too many pieces");
        t->npieces++;
    }
    if (pv->npieces) {
        for (size_t i = 0; i < cat->ntensors; i++) {
            ckpt_tensor *t = &cat->tensors[i];
            if (t->npieces < 2) continue;
            ckpt_piece *all =
                arena_alloc_aligned(&pv->mem, (size_t)t->npieces * sizeof *t->pieces, 8);
            if (!all) return ckpt_fail(err, -ENOMEM, "out of memory");
            all[0] = t->pieces[0]; /* the one added first */
            t->pieces = all;
            t->npieces = 1;
        }
        for (size_t i = 0; i < pv->npieces; i++) {
            ckpt_tensor *t = &cat->tensors[pv->pieces[i].tensor];
            t->pieces[t->npieces++] = pv->pieces[i].piece;
        }
    }
    for (size_t i = 0; i < cat->ntensors; i++) {
        ckpt_tensor *t = &cat->tensors[i];
        for (uint32_t k = 0; t->ndim && k < t->npieces; k++)
            if (!t->pieces[k].sizes) t->pieces[k].sizes = t->shape;
    }
    free(pv->pieces);
    pv->pieces = NULL;
    pv->npieces = pv->cap_pieces = 0;
    return 0;
}

typedef struct index_job {
    ckpt_catalog *cat;
    int rc;
    ckpt_err err;
} index_job;

static void *build_indexes(void *arg) {
    index_job *job = arg;
    for (size_t i = 0; !job->rc && i < job->cat->ntensors; i++)
        job->rc = planner_piece_index_build(job->cat, &job->cat->tensors[i], &job->err);
    return NULL;
}

typedef struct part_start {
    remote_object *object;
    uint64_t offset;
    bool hard; /* a member's end: not even a reader of many tensors reads past it */
} part_start;

static int by_object(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)((const part_start *)a)->object;
    uintptr_t y = (uintptr_t)((const part_start *)b)->object;
    return (x > y) - (x < y);
}

/* The bytes a piece without strides spans in its file, 0 if it has strides. */
static uint64_t piece_bytes(const ckpt_tensor *t, const ckpt_piece *pc) {
    if (pc->strides) return 0;
    uint64_t numel = 1;
    for (uint32_t d = 0; d < t->ndim; d++)
        if (__builtin_mul_overflow(numel, pc->sizes[d], &numel)) return 0;
    const ckpt_dtype_info *dt = ckpt_dtype_info_of(t->dtype);
    uint64_t bytes;
    if (__builtin_mul_overflow((numel + dt->block - 1) / dt->block, (uint64_t)dt->block_bytes,
                               &bytes))
        return 0;
    return bytes;
}

/* A piece that starts where the tensor's previous piece ends in the same file is no part start:
 * a reader of the tensor reads on into it. */
static bool continues(const ckpt_tensor *t, uint32_t j) {
    if (j == 0) return false;
    const ckpt_piece *prev = &t->pieces[j - 1], *pc = &t->pieces[j];
    uint64_t len = piece_bytes(t, prev);
    return len && prev->source == pc->source && prev->file_offset + len == pc->file_offset;
}

/* Tells each remote object where its tensors' bytes start and its tar members' bytes start and
 * end (the members of a remote tar share their archive's object, at their offsets in it), so
 * prefetch stays inside the tensor or member a reader reads. Only a hint: without memory for
 * it, prefetch just runs further. */
static void tell_remote_boundaries(ckpt_catalog *cat) {
    size_t n = 0;
    for (size_t i = 0; i < cat->ntensors; i++)
        for (uint32_t j = 0; j < cat->tensors[i].npieces; j++) {
            const ckpt_source *s = &cat->sources[cat->tensors[i].pieces[j].source];
            n += s->remote && !s->zst;
        }
    for (uint32_t i = 0; i < cat->nsources; i++)
        n += cat->sources[i].remote && !cat->sources[i].zst && cat->sources[i].member_of ? 2 : 0;
    part_start *p = n ? malloc(n * sizeof *p) : NULL;
    uint64_t *offs = n ? malloc(n * sizeof *offs) : NULL;
    bool *hard = n ? malloc(n * sizeof *hard) : NULL;
    if (p && offs && hard) {
        size_t k = 0;
        for (size_t i = 0; i < cat->ntensors; i++)
            for (uint32_t j = 0; j < cat->tensors[i].npieces; j++) {
                const ckpt_piece *pc = &cat->tensors[i].pieces[j];
                const ckpt_source *s = &cat->sources[pc->source];
                if (s->remote && !s->zst && !continues(&cat->tensors[i], j))
                    p[k++] = (part_start){s->remote, pc->file_offset + (s->member_of ? s->base : 0),
                                          false};
            }
        /* A member's bytes end where the next member's header begins: a reader of its last
         * tensor (or of the member whole) has no use for what follows. */
        for (uint32_t i = 0; i < cat->nsources; i++) {
            const ckpt_source *s = &cat->sources[i];
            if (!s->remote || s->zst || !s->member_of) continue;
            p[k++] = (part_start){s->remote, s->base, false};
            p[k++] = (part_start){s->remote, s->base + s->size, true};
        }
        n = k;
        qsort(p, n, sizeof *p, by_object);
        for (size_t a = 0, b; a < n; a = b) {
            for (b = a; b < n && p[b].object == p[a].object; b++) {
                offs[b - a] = p[b].offset;
                hard[b - a] = p[b].hard;
            }
            remote_set_boundaries(p[a].object, offs, hard, b - a);
        }
    }
    free(p);
    free(offs);
    free(hard);
}

/* Names no safetensors header can hold (not UTF-8, or its "__metadata__" key): said once at
 * open, since the Hugging Face view leaves those tensors out and a safetensors OUT refuses
 * them. */
static void warn_names_safetensors_lacks(ckpt_catalog *cat) {
    size_t bad = 0;
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        bool reserved = ckpt_safetensors_reserved_name(t->name, t->name_len);
        if (t->aside || (!reserved && utf8_valid(t->name, t->name_len)) || bad++ >= 10) continue;
        char shown[256];
        catalog_warn(cat,
                     "tensor \"%s\": %s, which a safetensors header cannot hold: the Hugging "
                     "Face view leaves it out",
                     utf8_shown(shown, sizeof shown, t->name, t->name_len),
                     reserved ? "the name is the header's metadata key" : "the name is not UTF-8");
    }
    if (bad > 10) catalog_warn(cat, "%zu tensors in all have names safetensors cannot hold", bad);
}

/* Dtypes no safetensors file can hold (ggml block types, complex): the Hugging Face view leaves
 * those tensors out, which a listing of .ckptfs/hf alone does not show. */
static void warn_dtypes_safetensors_lacks(ckpt_catalog *cat) {
    size_t count[CKPT_DTYPE_COUNT] = {0}, total = 0;
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        if (t->aside || (unsigned)t->dtype >= CKPT_DTYPE_COUNT ||
            ckpt_dtype_info_of(t->dtype)->safetensors)
            continue;
        count[t->dtype]++;
        total++;
    }
    if (!total) return;
    strbuf sb;
    sb_init(&sb);
    for (unsigned d = 0; d < CKPT_DTYPE_COUNT; d++)
        if (count[d])
            sb_printf(&sb, "%s%s %zu", sb.len ? ", " : "", ckpt_dtype_info_of((ckpt_dtype)d)->name,
                      count[d]);
    catalog_warn(cat,
                 "%zu tensor%s of dtypes a safetensors file cannot hold (%s): the Hugging Face "
                 "view leaves %s out",
                 total, total == 1 ? "" : "s", sb.failed ? "..." : sb.data,
                 total == 1 ? "it" : "them");
    sb_free(&sb);
}

int catalog_finish(ckpt_catalog *cat, ckpt_err *err) {
    int rc = attach_pieces(cat, err);
    if (rc) return rc;
    /* Most decoders add the tensors in name order already (a safetensors header mostly is):
     * glibc sorts elements this big through a table of 16 bytes each, 16 MB at a million. */
    size_t sorted = 1;
    while (sorted < cat->ntensors && name_cmp(&cat->tensors[sorted - 1], &cat->tensors[sorted]) < 0)
        sorted++;
    if (sorted < cat->ntensors) qsort(cat->tensors, cat->ntensors, sizeof *cat->tensors, name_cmp);
    for (size_t i = 1; i < cat->ntensors; i++) {
        if (name_cmp(&cat->tensors[i - 1], &cat->tensors[i]) == 0) {
            const ckpt_tensor *t = &cat->tensors[i];
            return ckpt_fail(err, -EINVAL, "%s: duplicate tensor name \"%.*s\" (defined twice)",
                             cat->root, SHOWN_NAME(t->name, t->name_len));
        }
    }
    /* Piece indexes (malloc'd, one per tensor) and paths (in the arena) touch different
     * fields: they are built side by side. */
    index_job job = {.cat = cat};
    ckpt_side_job side;
    ckpt_side_start(&side, build_indexes, &job, cat->ntensors >= 4096);
    rc = treepath_assign(cat, err);
    ckpt_side_join(&side);
    if (job.rc) {
        *err = job.err;
        return job.rc; /* the index's complaint comes first, as when built one after the other */
    }
    if (rc) return rc;
    size_t incomplete = 0;
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        if (t->incomplete && incomplete++ < 10)
            catalog_warn(cat,
                         "tensor \"%.*s\" is incomplete: part of it is in no file (reads "
                         "there fail with EIO)",
                         SHOWN_NAME(t->name, t->name_len));
    }
    if (incomplete > 10) catalog_warn(cat, "%zu incomplete tensors in all", incomplete);
    warn_names_safetensors_lacks(cat);
    warn_dtypes_safetensors_lacks(cat);
    tell_remote_boundaries(cat);
    return 0;
}
