/* The extent planner: maps a byte range of a tensor's logical row-major layout onto the file
 * segments that hold it.
 *
 * Pieces are boxes of the full tensor. For lookup, the distinct piece boundaries on each
 * dimension cut the tensor into a grid; each grid cell records the piece that covers it (or
 * none: a hole). From any element, the planner emits the longest run that is contiguous both in
 * the logical layout and in the piece's file layout, so a 1 MiB read of a tensor split on dim 1
 * costs one binary search per dimension per row fragment, and an unsplit tensor costs nothing. */
#include "catalog.h"
#include "../util/search.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct ckpt_piece_index {
    uint32_t ndim;
    uint64_t esz;       /* bytes per element (packed and block types never get an index) */
    uint64_t **strides; /* per piece: element strides (explicit or row-major) */
    uint32_t *contig;   /* per piece: first dim of its contiguous suffix, ndim = none */
    int32_t *cells;     /* piece per grid cell, -1 = hole */
    uint32_t *nbounds;  /* per dim */
    uint64_t *bounds[]; /* per dim, 2 * npieces + 2 room; sized by ndim, not CKPT_MAX_DIMS */
};

void planner_piece_index_free(ckpt_piece_index *ix) {
    if (!ix) return;
    free(ix->cells);
    free(ix); /* everything else lives in its allocation */
}

static int u64_cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Index of the last bound <= v. */
static uint32_t bound_search(const uint64_t *b, uint32_t n, uint64_t v) {
    return (uint32_t)last_at_or_before(b, n, v);
}

static bool row_major(const ckpt_piece *p, uint32_t ndim) {
    if (!p->strides) return true;
    uint64_t expect = 1;
    for (uint32_t d = ndim; d-- > 0;) {
        if (p->sizes[d] > 1 && p->strides[d] != expect) return false;
        expect *= p->sizes[d];
    }
    return true;
}

static bool covers_all(const ckpt_piece *p, const ckpt_tensor *t) {
    for (uint32_t d = 0; d < t->ndim; d++)
        if (p->offsets[d] != 0 || p->sizes[d] != t->shape[d]) return false;
    return true;
}

static bool same_box(const ckpt_piece *a, const ckpt_piece *b, uint32_t ndim) {
    for (uint32_t d = 0; d < ndim; d++)
        if (a->offsets[d] != b->offsets[d] || a->sizes[d] != b->sizes[d]) return false;
    return true;
}

#define NAME_ARGS(t) SHOWN_NAME((t)->name, (t)->name_len)

/* Checks a piece's box against the tensor and its bytes against its file. */
static int check_piece(const ckpt_catalog *cat, const ckpt_tensor *t, const ckpt_piece *p,
                       uint32_t k, ckpt_err *err) {
    const ckpt_source *src = &cat->sources[p->source];
    uint64_t numel = 1, extent = 1;
    for (uint32_t d = 0; d < t->ndim; d++) {
        uint64_t end;
        if (__builtin_add_overflow(p->offsets[d], p->sizes[d], &end) || end > t->shape[d])
            return ckpt_fail(err, -EINVAL,
                             "%s: tensor \"%.*s\": piece %u lies outside the shape on dim %u",
                             src->path, NAME_ARGS(t), k, d);
        if (__builtin_mul_overflow(numel, p->sizes[d], &numel))
            return ckpt_fail(err, -EOVERFLOW, "%s: tensor \"%.*s\": piece %u size overflows",
                             src->path, NAME_ARGS(t), k);
    }
    if (numel == 0) return 0;
    if (p->strides) {
        for (uint32_t d = 0; d < t->ndim; d++) {
            uint64_t span;
            if (__builtin_mul_overflow(p->sizes[d] - 1, p->strides[d], &span) ||
                __builtin_add_overflow(extent, span, &extent))
                return ckpt_fail(err, -EOVERFLOW, "%s: tensor \"%.*s\": piece %u strides overflow",
                                 src->path, NAME_ARGS(t), k);
        }
    } else {
        extent = numel;
    }
    const ckpt_dtype_info *dt = ckpt_dtype_info_of(t->dtype);
    uint64_t bytes, end;
    if (__builtin_mul_overflow((extent + dt->block - 1) / dt->block, (uint64_t)dt->block_bytes,
                               &bytes) ||
        __builtin_add_overflow(p->file_offset, bytes, &end) || end > src->size)
        return ckpt_fail(err, -EINVAL,
                         "%s: tensor \"%.*s\": bytes at offset %llu run past the end of the file "
                         "(size %llu)",
                         src->path, NAME_ARGS(t), (unsigned long long)p->file_offset,
                         (unsigned long long)src->size);
    return 0;
}

static int build_grid(ckpt_piece_index *ix, const ckpt_catalog *cat, ckpt_tensor *t,
                      ckpt_err *err) {
    uint32_t nd = t->ndim;
    size_t ncells = 1;
    for (uint32_t d = 0; d < nd; d++) {
        uint64_t *b = ix->bounds[d]; /* room for 2 * npieces + 2 */
        size_t n = 0;
        b[n++] = 0;
        b[n++] = t->shape[d];
        for (uint32_t k = 0; k < t->npieces; k++) {
            b[n++] = t->pieces[k].offsets[d];
            b[n++] = t->pieces[k].offsets[d] + t->pieces[k].sizes[d];
        }
        if (n <= 16) { /* the usual few pieces: qsort's call overhead dominated mounts */
            for (size_t i = 1; i < n; i++) {
                uint64_t x = b[i];
                size_t j = i;
                for (; j > 0 && b[j - 1] > x; j--) b[j] = b[j - 1];
                b[j] = x;
            }
        } else {
            qsort(b, n, sizeof *b, u64_cmp);
        }
        size_t u = 1;
        for (size_t i = 1; i < n; i++)
            if (b[i] != b[u - 1]) b[u++] = b[i];
        ix->nbounds[d] = (uint32_t)u;
        if (u < 2) return 0; /* an empty dimension: nothing to look up */
        if (__builtin_mul_overflow(ncells, u - 1, &ncells) || ncells > (1u << 24))
            return ckpt_fail(err, -E2BIG,
                             "%s: tensor \"%.*s\": %u pieces cut it into too many regions",
                             cat->root, NAME_ARGS(t), t->npieces);
    }
    ix->cells = malloc(ncells * sizeof *ix->cells);
    if (!ix->cells) return ckpt_fail(err, -ENOMEM, "out of memory");
    for (size_t i = 0; i < ncells; i++) ix->cells[i] = -1;

    for (uint32_t k = 0; k < t->npieces; k++) {
        const ckpt_piece *p = &t->pieces[k];
        uint32_t lo[CKPT_MAX_DIMS], hi[CKPT_MAX_DIMS], at[CKPT_MAX_DIMS];
        bool empty = false;
        for (uint32_t d = 0; d < nd; d++) {
            lo[d] = bound_search(ix->bounds[d], ix->nbounds[d], p->offsets[d]);
            hi[d] = bound_search(ix->bounds[d], ix->nbounds[d], p->offsets[d] + p->sizes[d]);
            at[d] = lo[d];
            if (lo[d] == hi[d]) empty = true;
        }
        if (empty) continue;
        for (;;) {
            size_t cell = 0;
            for (uint32_t d = 0; d < nd; d++) cell = cell * (ix->nbounds[d] - 1) + at[d];
            int32_t owner = ix->cells[cell];
            if (owner < 0) {
                ix->cells[cell] = (int32_t)k;
            } else if (!same_box(&t->pieces[owner], p, nd)) {
                return ckpt_fail(err, -EINVAL,
                                 "%s: tensor \"%.*s\": pieces %d and %u overlap without being "
                                 "replicas of the same region",
                                 cat->root, NAME_ARGS(t), owner, k);
            }
            uint32_t d = nd;
            while (d-- > 0) {
                if (++at[d] < hi[d]) break;
                at[d] = lo[d];
            }
            if (d == UINT32_MAX) break;
        }
    }

    /* Coverage: a hole is allowed (the sidecar says so) but reads of it fail. */
    uint64_t covered = 0;
    uint32_t at[CKPT_MAX_DIMS] = {0};
    for (size_t cell = 0; cell < ncells; cell++) {
        if (ix->cells[cell] >= 0) {
            uint64_t vol = 1;
            for (uint32_t d = 0; d < nd; d++)
                vol *= ix->bounds[d][at[d] + 1] - ix->bounds[d][at[d]];
            covered += vol;
        }
        for (uint32_t d = nd; d-- > 0;) {
            if (++at[d] < ix->nbounds[d] - 1) break;
            at[d] = 0;
        }
    }
    t->incomplete = covered != t->numel;
    return 0;
}

int planner_piece_index_build(ckpt_catalog *cat, ckpt_tensor *t, ckpt_err *err) {
    unsigned esz = ckpt_dtype_elem_size(t->dtype);
    for (uint32_t k = 0; k < t->npieces; k++) {
        int rc = check_piece(cat, t, &t->pieces[k], k, err);
        if (rc) return rc;
    }
    if (t->nbytes == 0) return 0;
    if (t->npieces == 1 && covers_all(&t->pieces[0], t) && row_major(&t->pieces[0], t->ndim))
        return 0; /* the fast path: no index */
    if (!esz)
        return ckpt_fail(err, -EINVAL,
                         "%s: tensor \"%.*s\": a %s tensor must be one contiguous piece", cat->root,
                         NAME_ARGS(t), ckpt_dtype_info_of(t->dtype)->name);

    /* One allocation per tensor for all but the cells (a DCP checkpoint has an index for every
     * tensor: separate blocks cost a fifth of the daemon's memory at 100k tensors). Pointers
     * and u64 arrays first, u32 arrays last, so every part is aligned. */
    uint32_t np = t->npieces, nd = t->ndim;
    size_t np1 = np ? np : 1, nd1 = nd ? nd : 1, nb = 2 * (size_t)np + 2;
    size_t bytes = sizeof(ckpt_piece_index) + nd * sizeof(uint64_t *) + np1 * sizeof(uint64_t *) +
                   np1 * nd1 * sizeof(uint64_t) + nd * nb * sizeof(uint64_t) +
                   (nd + np1) * sizeof(uint32_t);
    ckpt_piece_index *ix = calloc(1, bytes);
    if (!ix) return ckpt_fail(err, -ENOMEM, "out of memory");
    t->index = ix;
    ix->ndim = nd;
    ix->esz = esz;
    char *at = (char *)(ix->bounds + nd);
    ix->strides = (uint64_t **)(void *)at;
    at += np1 * sizeof(uint64_t *);
    uint64_t *stride_mem = (uint64_t *)(void *)at;
    at += np1 * nd1 * sizeof(uint64_t);
    for (uint32_t d = 0; d < nd; d++) ix->bounds[d] = (uint64_t *)(void *)at + d * nb;
    at += nd * nb * sizeof(uint64_t);
    ix->nbounds = (uint32_t *)(void *)at;
    ix->contig = ix->nbounds + nd;
    for (uint32_t k = 0; k < np; k++) {
        const ckpt_piece *p = &t->pieces[k];
        uint64_t *st = stride_mem + (size_t)k * nd;
        ix->strides[k] = st;
        uint64_t acc = 1;
        for (uint32_t d = nd; d-- > 0;) {
            st[d] = p->strides ? p->strides[d] : acc;
            acc *= p->sizes[d];
        }
        /* Contiguous suffix: unit last stride, then extend left while the inner dim is full
         * and the outer stride steps exactly over it. */
        uint32_t c = nd;
        if (nd && (st[nd - 1] == 1 || p->sizes[nd - 1] == 1)) {
            c = nd - 1;
            uint64_t span = p->sizes[nd - 1];
            while (c > 0 && p->sizes[c] == t->shape[c] &&
                   (st[c - 1] == span || p->sizes[c - 1] == 1)) {
                span *= p->sizes[c - 1];
                c--;
            }
        }
        ix->contig[k] = c;
    }
    return build_grid(ix, cat, t, err);
}

/* Elements from idx to the end of the logically contiguous block of box (off, size) whose
 * dims after c are full. */
static uint64_t run_in_box(const ckpt_tensor *t, const uint64_t *off, const uint64_t *size,
                           uint32_t c, const uint64_t *idx) {
    if (c >= t->ndim) return 1;
    uint64_t inner = 1, r = 0;
    for (uint32_t d = t->ndim - 1; d > c; d--) {
        r += idx[d] * inner;
        inner *= t->shape[d];
    }
    r += (idx[c] - off[c]) * inner;
    return size[c] * inner - r;
}

static size_t emit(ckpt_segment *seg, size_t n, size_t cap, const ckpt_segment *s) {
    if (n > 0) {
        ckpt_segment *last = &seg[n - 1];
        bool adjacent = last->kind == s->kind && last->source == s->source &&
                        last->offset + last->length == s->offset;
        if ((last->kind == s->kind && s->kind == CKPT_SEG_HOLE) ||
            (adjacent && s->kind == CKPT_SEG_FILE) ||
            (adjacent && s->kind == CKPT_SEG_STRIDED && last->piece == s->piece &&
             last->mem == s->mem)) {
            last->length += s->length;
            return n;
        }
    }
    if (n == cap) return SIZE_MAX;
    seg[n] = *s;
    return n + 1;
}

size_t ckpt_plan(const ckpt_tensor *t, uint64_t off, uint64_t len, ckpt_segment *seg, size_t cap,
                 uint64_t *done) {
    *done = 0;
    if (off >= t->nbytes || len == 0 || cap == 0) return 0;
    if (len > t->nbytes - off) len = t->nbytes - off;
    const ckpt_piece_index *ix = t->index;
    if (!ix) {
        const ckpt_piece *p = &t->pieces[0];
        seg[0] = (ckpt_segment){.kind = CKPT_SEG_FILE,
                                .source = p->source,
                                .offset = p->file_offset + off,
                                .length = len};
        *done = len;
        return 1;
    }
    uint32_t nd = t->ndim;
    uint64_t pos = off, end = off + len, esz = ix->esz;
    size_t n = 0;
    while (pos < end) {
        uint64_t e = pos / esz, b = pos % esz, rest = e;
        uint64_t idx[CKPT_MAX_DIMS], cell_off[CKPT_MAX_DIMS], cell_size[CKPT_MAX_DIMS];
        size_t cell = 0;
        for (uint32_t d = nd; d-- > 0;) {
            idx[d] = rest % t->shape[d];
            rest /= t->shape[d];
        }
        for (uint32_t d = 0; d < nd; d++) {
            uint32_t ci = bound_search(ix->bounds[d], ix->nbounds[d], idx[d]);
            cell = cell * (ix->nbounds[d] - 1) + ci;
            cell_off[d] = ix->bounds[d][ci];
            cell_size[d] = ix->bounds[d][ci + 1] - cell_off[d];
        }
        int32_t k = ix->cells[cell];
        uint64_t run;
        ckpt_segment s = {.kind = CKPT_SEG_HOLE};
        if (k >= 0 && nd && ix->contig[k] == nd) {
            /* No two logically adjacent elements are adjacent in the file: one segment for the
             * logically contiguous run within the piece, read in blocks (core/read/strided.c). */
            const ckpt_piece *p = &t->pieces[k];
            uint32_t c = nd - 1;
            while (c > 0 && p->sizes[c] == t->shape[c]) c--;
            run = run_in_box(t, p->offsets, p->sizes, c, idx);
            s = (ckpt_segment){.kind = CKPT_SEG_STRIDED,
                               .source = p->source,
                               .offset = pos,
                               .mem = t,
                               .piece = (uint32_t)k};
        } else if (k >= 0) {
            const ckpt_piece *p = &t->pieces[k];
            const uint64_t *st = ix->strides[k];
            run = run_in_box(t, p->offsets, p->sizes, ix->contig[k], idx);
            uint64_t el = 0;
            for (uint32_t d = 0; d < nd; d++) el += (idx[d] - p->offsets[d]) * st[d];
            s = (ckpt_segment){.kind = CKPT_SEG_FILE,
                               .source = p->source,
                               .offset = p->file_offset + el * esz + b};
        } else {
            uint32_t c = nd ? nd - 1 : 0;
            while (c > 0 && cell_size[c] == t->shape[c]) c--;
            run = run_in_box(t, cell_off, cell_size, c, idx);
        }
        uint64_t take = run * esz - b;
        if (take > end - pos) take = end - pos;
        s.length = take;
        size_t m = emit(seg, n, cap, &s);
        if (m == SIZE_MAX) break;
        n = m;
        pos += take;
    }
    *done = pos - off;
    return n;
}
