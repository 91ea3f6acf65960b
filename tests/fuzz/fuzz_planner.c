/* libFuzzer harness: the extent planner (core/model/planner.c, core/model/vfile.c), checked for
 * correctness, not only for crashes.
 *
 * The input describes one tensor: dtype, shape, and pieces (grid partitions with holes and
 * replicas, arbitrary boxes, whole-tensor views with padded, permuted, interleaved or zero
 * strides) in two files. When catalog_finish accepts it, a naive reference maps every logical
 * byte to (file, offset) — the first piece that covers its element, as documented — and every
 * planned segment of every queried range, with any segment cap, must agree byte for byte, cover
 * exactly what was asked, and be merged where runs touch. The same holds through a virtual file
 * that wraps part of the tensor between memory parts. */
#include "fuzz_common.h"

enum { FILE_A_SIZE = 1 << 20, FILE_B_SIZE = (1 << 16) + 13, MAX_CHECKED = 1 << 16 };

typedef struct reader {
    const uint8_t *d;
    size_t n, at;
} reader;

static unsigned u8(reader *r) {
    return r->at < r->n ? r->d[r->at++] : 0;
}

static uint64_t u16(reader *r) {
    uint64_t v = u8(r);
    return v | (uint64_t)u8(r) << 8;
}

static uint64_t u64(reader *r) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)u8(r) << (8 * i);
    return v;
}

static char path_a[600], path_b[600];

static void make_sources(void) {
    if (path_a[0]) return;
    const char *dir = fz_fresh_dir();
    snprintf(path_a, sizeof path_a, "%s/a", dir);
    snprintf(path_b, sizeof path_b, "%s/b", dir);
    int fa = open(path_a, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int fb = open(path_b, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    FZ_CHECK(fa >= 0 && fb >= 0 && ftruncate(fa, FILE_A_SIZE) == 0 &&
                 ftruncate(fb, FILE_B_SIZE) == 0,
             "cannot make the source files");
    close(fa);
    close(fb);
}

/* ---- building the tensor from the input ---- */

typedef struct spec {
    uint32_t ndim;
    uint64_t shape[4];
    ckpt_dtype dtype;
} spec;

static uint64_t file_offset_of(reader *r, uint32_t source) {
    unsigned sel = u8(r) % 8;
    if (sel == 0) return u64(r); /* anything: overflow and past-EOF checks */
    if (sel == 1) return (source ? FILE_B_SIZE : FILE_A_SIZE) - u16(r) % 4096;
    return u16(r);
}

/* Strides for a box of `sizes`: NULL (row-major) or one of the layouts formats produce. */
static const uint64_t *strides_of(reader *r, const spec *s, const uint64_t *sizes, uint64_t *st) {
    uint32_t nd = s->ndim;
    if (nd == 0) return NULL;
    switch (u8(r) % 6) {
    case 0:
    case 1:
        return NULL;
    case 2: { /* row-major with padded rows and maybe an interleaved last dim */
        uint64_t acc = 1 + u8(r) % 2;
        for (uint32_t d = nd; d-- > 0;) {
            st[d] = acc;
            acc *= sizes[d] + u8(r) % 3;
        }
        return st;
    }
    case 3: { /* row-major in a permuted dim order (column-major and friends) */
        uint32_t perm[4] = {0, 1, 2, 3};
        for (uint32_t i = nd; i-- > 1;) {
            uint32_t j = u8(r) % (i + 1), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        uint64_t acc = 1;
        for (uint32_t k = nd; k-- > 0;) {
            st[perm[k]] = acc;
            acc *= sizes[perm[k]] ? sizes[perm[k]] : 1;
        }
        return st;
    }
    case 4: /* explicit row-major: must behave exactly like NULL */
    {
        uint64_t acc = 1;
        for (uint32_t d = nd; d-- > 0;) {
            st[d] = acc;
            acc *= sizes[d];
        }
        return st;
    }
    default: /* small arbitrary strides, zero (broadcast) included */
        for (uint32_t d = 0; d < nd; d++) st[d] = u8(r) % 7;
        return st;
    }
}

static int add_piece(ckpt_catalog *cat, reader *r, const spec *s, const uint64_t *off,
                     const uint64_t *size, ckpt_err *err) {
    uint32_t source = u8(r) & 1;
    uint64_t st[4];
    uint64_t fo = file_offset_of(r, source);
    const uint64_t *strides = strides_of(r, s, size, st);
    bool nulls = (u8(r) & 3) == 0; /* NULL offsets/sizes mean origin/full shape */
    bool origin = true, full = true;
    for (uint32_t d = 0; d < s->ndim; d++) {
        origin &= off[d] == 0;
        full &= size[d] == s->shape[d];
    }
    return catalog_add_piece(cat, 0, source, fo, nulls && origin ? NULL : off,
                             nulls && full ? NULL : size, strides, err);
}

static int build(ckpt_catalog *cat, reader *r, spec *s, ckpt_err *err) {
    static const ckpt_dtype plain[] = {CKPT_U8, CKPT_F16, CKPT_F32, CKPT_F64, CKPT_C128, CKPT_BOOL};
    static const ckpt_dtype packed[] = {CKPT_F4, CKPT_F6_E2M3, CKPT_Q4_0, CKPT_Q8_0};
    unsigned b = u8(r);
    s->dtype = b & 0x80 ? packed[b % 4] : plain[b % 6];
    s->ndim = u8(r) % 5;
    for (uint32_t d = 0; d < s->ndim; d++) s->shape[d] = u8(r) % 9;
    unsigned block = ckpt_dtype_info_of(s->dtype)->block;
    if (block > 1 && s->ndim) s->shape[s->ndim - 1] *= block;
    size_t ti;
    int rc = catalog_add_tensor(cat, "t", 1, s->dtype, s->ndim, s->shape, &ti, err);
    if (rc) return rc;

    uint32_t nd = s->ndim;
    uint64_t off[4] = {0}, size[4];
    memcpy(size, s->shape, sizeof size);
    switch (u8(r) % 4) {
    case 0:   /* a grid: cut points per dim, each cell a piece, two replicas or a hole */
    case 3: { /* (3: cells of one file back to back, as tensor-parallel shards are) */
        uint64_t cuts[4][5];
        uint32_t ncuts[4], at[4] = {0};
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t *c = cuts[d];
            uint32_t k = 0;
            c[k++] = 0;
            for (unsigned extra = u8(r) % 3; extra > 0; extra--) {
                uint64_t v = s->shape[d] ? 1 + u8(r) % s->shape[d] : 0;
                uint32_t i = k;
                while (i > 0 && c[i - 1] > v) c[i] = c[i - 1], i--;
                c[i] = v;
                k++;
            }
            c[k++] = s->shape[d];
            uint32_t u = 1;
            for (uint32_t i = 1; i < k; i++)
                if (c[i] != c[u - 1]) c[u++] = c[i];
            ncuts[d] = u;
            if (u < 2) return 0; /* an empty dimension: no pieces at all */
        }
        bool packed_run = u8(r) % 4 == 3;
        uint64_t next = u16(r);
        for (int cells = 0; cells < 64; cells++) {
            uint64_t numel = 1;
            for (uint32_t d = 0; d < nd; d++) {
                off[d] = cuts[d][at[d]];
                size[d] = cuts[d][at[d] + 1] - off[d];
                numel *= size[d];
            }
            unsigned act = u8(r) % 8;
            for (unsigned copies = act == 0 ? 0 : act == 1 ? 2 : 1; copies > 0; copies--) {
                if (packed_run) {
                    uint64_t esz = ckpt_dtype_elem_size(s->dtype);
                    rc = catalog_add_piece(cat, 0, 0, next, off, size, NULL, err);
                    next += numel * (esz ? esz : 1);
                } else {
                    rc = add_piece(cat, r, s, off, size, err);
                }
                if (rc) return rc;
            }
            uint32_t d = nd;
            while (d-- > 0) {
                if (++at[d] < ncuts[d] - 1) break;
                at[d] = 0;
            }
            if (d == UINT32_MAX) break;
        }
        return 0;
    }
    case 1: /* arbitrary boxes: overlaps and out-of-shape boxes must be refused */
        for (unsigned np = u8(r) % 6; np > 0; np--) {
            for (uint32_t d = 0; d < nd; d++) {
                off[d] = u8(r) % (s->shape[d] + 2);
                size[d] = u8(r) % (s->shape[d] + 2);
            }
            if ((rc = add_piece(cat, r, s, off, size, err))) return rc;
        }
        return 0;
    default: /* the whole tensor, once or twice, in some layout */
        for (unsigned np = 1 + u8(r) % 2; np > 0; np--)
            if ((rc = add_piece(cat, r, s, off, size, err))) return rc;
        return 0;
    }
}

/* ---- the reference: logical byte -> (source, file offset), or a hole ---- */

static int32_t ref_src[MAX_CHECKED];
static uint64_t ref_off[MAX_CHECKED];

static bool build_reference(const ckpt_tensor *t) {
    if (t->nbytes > MAX_CHECKED) return false;
    unsigned esz = ckpt_dtype_elem_size(t->dtype);
    if (!esz) { /* packed types are accepted only as one whole row-major piece (or empty) */
        if (!t->nbytes) return true;
        FZ_CHECK(t->npieces == 1 && !t->index, "packed tensor with %u pieces / an index",
                 t->npieces);
        for (uint64_t b = 0; b < t->nbytes; b++) {
            ref_src[b] = (int32_t)t->pieces[0].source;
            ref_off[b] = t->pieces[0].file_offset + b;
        }
        return true;
    }
    bool hole = false;
    for (uint64_t e = 0; e < t->numel; e++) {
        uint64_t idx[CKPT_MAX_DIMS], rest = e;
        for (uint32_t d = t->ndim; d-- > 0;) {
            idx[d] = rest % t->shape[d];
            rest /= t->shape[d];
        }
        int32_t src = -1;
        uint64_t fo = 0;
        for (uint32_t k = 0; k < t->npieces && src < 0; k++) {
            const ckpt_piece *p = &t->pieces[k];
            bool in = true;
            for (uint32_t d = 0; d < t->ndim && in; d++)
                in = idx[d] >= p->offsets[d] && idx[d] < p->offsets[d] + p->sizes[d];
            if (!in) continue;
            uint64_t el = 0, acc = 1;
            for (uint32_t d = t->ndim; d-- > 0;) {
                uint64_t st = p->strides ? p->strides[d] : acc;
                el += (idx[d] - p->offsets[d]) * st;
                acc *= p->sizes[d];
            }
            src = (int32_t)p->source;
            fo = p->file_offset + el * esz;
        }
        hole |= src < 0;
        for (unsigned i = 0; i < esz; i++) {
            ref_src[e * esz + i] = src;
            ref_off[e * esz + i] = fo + i;
        }
    }
    FZ_CHECK(t->incomplete == hole, "incomplete flag %d, reference finds %s", t->incomplete,
             hole ? "a hole" : "no hole");
    return true;
}

/* ---- checking plans against the reference ---- */

typedef struct expect_part {
    uint64_t start, length;
    const char *mem; /* memory part, or NULL for the tensor */
    uint64_t t_off;  /* tensor part: tensor byte at start */
} expect_part;

/* What byte `pos` of the object should be: a tensor byte (via the reference) or a memory byte. */
static void expected_byte(const expect_part *parts, size_t nparts, uint64_t pos, int32_t *src,
                          uint64_t *off, const char **mem, uint64_t *tbyte) {
    for (size_t i = 0; i < nparts; i++) {
        const expect_part *p = &parts[i];
        if (pos < p->start || pos - p->start >= p->length) continue;
        if (p->mem) {
            *src = -2;
            *mem = p->mem + (pos - p->start);
        } else {
            uint64_t b = p->t_off + (pos - p->start);
            *tbyte = b;
            *src = ref_src[b];
            *off = ref_off[b];
        }
        return;
    }
    fz_die("byte %llu is in no part", (unsigned long long)pos);
}

/* Where the strided segment's piece keeps tensor byte b: false when b's element is outside the
 * piece's box. */
static bool strided_byte(const ckpt_segment *s, uint64_t b, uint64_t *fo) {
    const ckpt_tensor *t = s->mem;
    if (!t || s->piece >= t->npieces) return false;
    const ckpt_piece *p = &t->pieces[s->piece];
    unsigned esz = ckpt_dtype_elem_size(t->dtype);
    if (!esz) return false;
    uint64_t e = b / esz, idx[CKPT_MAX_DIMS], el = 0, acc = 1;
    for (uint32_t d = t->ndim; d-- > 0;) {
        idx[d] = e % t->shape[d];
        e /= t->shape[d];
    }
    for (uint32_t d = t->ndim; d-- > 0;) {
        if (idx[d] < p->offsets[d] || idx[d] >= p->offsets[d] + p->sizes[d]) return false;
        el += (idx[d] - p->offsets[d]) * (p->strides ? p->strides[d] : acc);
        acc *= p->sizes[d];
    }
    *fo = p->file_offset + el * esz + b % esz;
    return true;
}

static void check_segments(const char *what, const expect_part *parts, size_t nparts, uint64_t size,
                           uint64_t off, uint64_t len, size_t cap, const ckpt_segment *seg,
                           size_t n, uint64_t done) {
    uint64_t want = off >= size ? 0 : (len < size - off ? len : size - off);
    if (want == 0 || cap == 0) {
        FZ_CHECK(n == 0 && done == 0, "%s: [%llu,+%llu) of %llu: %zu segments for nothing", what,
                 (unsigned long long)off, (unsigned long long)len, (unsigned long long)size, n);
        return;
    }
    FZ_CHECK(n >= 1 && n <= cap && done > 0 && done <= want,
             "%s: [%llu,+%llu) of %llu cap %zu: %zu segments, %llu bytes", what,
             (unsigned long long)off, (unsigned long long)len, (unsigned long long)size, cap, n,
             (unsigned long long)done);
    FZ_CHECK(done == want || n == cap, "%s: stopped at %llu of %llu with %zu of %zu segments", what,
             (unsigned long long)done, (unsigned long long)want, n, cap);
    uint64_t pos = off;
    for (size_t i = 0; i < n; i++) {
        const ckpt_segment *s = &seg[i];
        FZ_CHECK(s->length > 0 && s->length <= off + done - pos, "%s: segment %zu of %llu bytes",
                 what, i, (unsigned long long)s->length);
        if (i > 0) {
            const ckpt_segment *p = &seg[i - 1];
            FZ_CHECK(!(p->kind == CKPT_SEG_HOLE && s->kind == CKPT_SEG_HOLE),
                     "%s: two holes in a row (segments %zu, %zu)", what, i - 1, i);
            FZ_CHECK(!(p->kind == CKPT_SEG_FILE && s->kind == CKPT_SEG_FILE &&
                       p->source == s->source && p->offset + p->length == s->offset),
                     "%s: segments %zu and %zu touch in file %u at %llu but are not merged", what,
                     i - 1, i, s->source, (unsigned long long)s->offset);
        }
        for (uint64_t k = 0; k < s->length; k++) {
            int32_t src = 0;
            uint64_t fo = 0;
            const char *mem = NULL;
            uint64_t tb = UINT64_MAX;
            expected_byte(parts, nparts, pos + k, &src, &fo, &mem, &tb);
            switch (s->kind) {
            case CKPT_SEG_FILE:
                FZ_CHECK(src >= 0 && (uint32_t)src == s->source && fo == s->offset + k,
                         "%s: byte %llu planned at file %u offset %llu, reference says "
                         "%s %d offset %llu",
                         what, (unsigned long long)(pos + k), s->source,
                         (unsigned long long)(s->offset + k),
                         src == -1   ? "hole"
                         : src == -2 ? "memory"
                                     : "file",
                         src, (unsigned long long)fo);
                break;
            case CKPT_SEG_HOLE:
                FZ_CHECK(src == -1, "%s: byte %llu planned as a hole, reference says %d", what,
                         (unsigned long long)(pos + k), src);
                break;
            case CKPT_SEG_MEM:
                FZ_CHECK(src == -2 && (const char *)s->mem + k == mem,
                         "%s: byte %llu planned from memory, reference says %d", what,
                         (unsigned long long)(pos + k), src);
                break;
            case CKPT_SEG_STRIDED: {
                uint64_t pfo = UINT64_MAX;
                bool in = tb == s->offset + k && strided_byte(s, tb, &pfo);
                FZ_CHECK(src >= 0 && (uint32_t)src == s->source && in && pfo == fo,
                         "%s: byte %llu planned as strided byte %llu of piece %u (file offset "
                         "%llu), reference says %d offset %llu",
                         what, (unsigned long long)(pos + k), (unsigned long long)(s->offset + k),
                         s->piece, (unsigned long long)pfo, src, (unsigned long long)fo);
                break;
            }
            default:
                fz_die("%s: segment kind %u", what, s->kind);
            }
        }
        pos += s->length;
    }
    FZ_CHECK(pos - off == done, "%s: segments cover %llu bytes, done says %llu", what,
             (unsigned long long)(pos - off), (unsigned long long)done);
}

static ckpt_segment segs[4096];

static void query_tensor(const ckpt_tensor *t, const expect_part *whole, uint64_t off, uint64_t len,
                         size_t cap) {
    uint64_t done = 12345;
    size_t n = ckpt_plan(t, off, len, segs, cap, &done);
    check_segments("tensor", whole, 1, t->nbytes, off, len, cap, segs, n, done);
}

/* The whole tensor in calls of at most `cap` segments, resuming where each stopped. */
static void resume_tensor(const ckpt_tensor *t, const expect_part *whole, size_t cap) {
    uint64_t off = 0;
    for (uint64_t calls = 0; off < t->nbytes; calls++) {
        FZ_CHECK(calls <= t->nbytes, "resuming with cap %zu does not progress", cap);
        uint64_t done = 0;
        size_t n = ckpt_plan(t, off, t->nbytes - off, segs, cap, &done);
        check_segments("tensor (resumed)", whole, 1, t->nbytes, off, t->nbytes - off, cap, segs, n,
                       done);
        off += done;
    }
}

static void check_vfile(reader *r, const ckpt_tensor *t) {
    static const char head[] = "HEADER--", tail[] = "TRAILER-";
    size_t hl = u8(r) % 9, tl = u8(r) % 9;
    uint64_t a = t->nbytes ? u16(r) % (t->nbytes + 1) : 0;
    uint64_t l = t->nbytes - a ? u16(r) % (t->nbytes - a + 1) : 0;
    ckpt_vfile vf = {0};
    expect_part parts[3];
    size_t np = 0;
    uint64_t at = 0;
    FZ_CHECK(ckpt_vfile_add_mem(&vf, head, hl) == 0, "vfile add");
    if (hl) parts[np++] = (expect_part){at, hl, head, 0}, at += hl;
    FZ_CHECK(ckpt_vfile_add_tensor(&vf, t, a, l) == 0, "vfile add tensor");
    if (l) parts[np++] = (expect_part){at, l, NULL, a}, at += l;
    FZ_CHECK(ckpt_vfile_add_mem(&vf, tail, tl) == 0, "vfile add");
    if (tl) parts[np++] = (expect_part){at, tl, tail, 0}, at += tl;
    FZ_CHECK(vf.size == at, "vfile size %llu, parts add up to %llu", (unsigned long long)vf.size,
             (unsigned long long)at);
    FZ_CHECK(ckpt_vfile_add_tensor(&vf, t, t->nbytes, 1) != 0, "vfile took a range past the end");
    for (int q = 0; q < 4; q++) {
        uint64_t off = u16(r) % (vf.size + 2), len = u16(r) % (vf.size + 2);
        size_t cap = q == 0 ? sizeof segs / sizeof *segs : 1 + u8(r) % 4;
        uint64_t done = 777;
        size_t n = ckpt_vfile_plan(&vf, off, len, segs, cap, &done);
        /* A vfile stops early only when the cap is used up; merging is per tensor part. */
        check_segments("vfile", parts, np, vf.size, off, len, cap, segs, n, done);
    }
    ckpt_vfile_free(&vf);
}

/* CKPTFS_FUZZ_STATS=1: how many inputs made it how far, printed at exit (is the harness
 * reaching the planner, or stuck in validation?). */
static unsigned long stat_inputs, stat_accepted, stat_indexed, stat_holes, stat_strided;

static void print_stats(void) {
    fprintf(stderr,
            "planner stats: %lu inputs, %lu accepted, %lu indexed, %lu with holes, %lu "
            "strided\n",
            stat_inputs, stat_accepted, stat_indexed, stat_holes, stat_strided);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!stat_inputs++ && getenv("CKPTFS_FUZZ_STATS")) atexit(print_stats);
    make_sources();
    reader r = {data, size, 0};
    ckpt_catalog *cat = catalog_new("/fuzz", "fuzz");
    FZ_CHECK(cat, "catalog_new");
    ckpt_err err;
    err.msg[0] = '\0';
    uint32_t s;
    FZ_CHECK(catalog_add_source(cat, path_a, "a", &s, &err) == 0 &&
                 catalog_add_source(cat, path_b, "b", &s, &err) == 0,
             "sources: %s", err.msg);
    spec sp = {0};
    int rc = build(cat, &r, &sp, &err);
    if (!rc) rc = catalog_finish(cat, &err);
    if (rc) {
        FZ_CHECK(rc < 0 && err.msg[0], "refused (%d) without a message", rc);
        ckpt_close(cat);
        return 0;
    }
    if (cat->ntensors == 0) {
        ckpt_close(cat);
        return 0;
    }
    const ckpt_tensor *t = &cat->tensors[0];
    stat_accepted++;
    stat_indexed += t->index != NULL;
    stat_holes += t->incomplete;
    for (uint32_t k = 0; k < t->npieces; k++)
        if (t->pieces[k].strides) {
            stat_strided++;
            break;
        }
    if (!build_reference(t)) {
        ckpt_close(cat);
        return 0;
    }
    expect_part whole = {0, t->nbytes, NULL, 0};
    query_tensor(t, &whole, 0, t->nbytes, sizeof segs / sizeof *segs);
    query_tensor(t, &whole, t->nbytes, 1, 4);
    query_tensor(t, &whole, 0, 0, 4);
    resume_tensor(t, &whole, 1);
    resume_tensor(t, &whole, 3);
    for (int q = 0; q < 6; q++) {
        uint64_t off = u16(&r) % (t->nbytes + 2), len = u16(&r) % (t->nbytes + 2);
        size_t cap = q < 2 ? sizeof segs / sizeof *segs : 1 + u8(&r) % 5;
        query_tensor(t, &whole, off, len, cap);
    }
    query_tensor(t, &whole, 1, UINT64_MAX, sizeof segs / sizeof *segs);
    check_vfile(&r, t);
    ckpt_close(cat);
    return 0;
}
