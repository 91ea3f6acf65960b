/* Staged files -> tensors -> a catalog, or the list of everything that is wrong (staged.h).
 *
 * Files are grouped by the tensor path they belong to ("base"): x.json and x.npy belong to x;
 * a raw file belongs to itself, or, named x.raw with neither x.raw.json nor x.raw.npy beside
 * it, to x. Each group is checked on its own and every problem is listed; the catalog is built
 * only when there are none. */
#include "staged.h"
#include "../parse/npy_header.h"
#include "../util/grow.h"
#include "../util/text.h"

#include "../model/catalog.h"
#include "../formats/formats.h"
#include "../util/hashmap.h"
#include "../util/json.h"
#include "../read/segread.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { SIDECAR_MAX = 16 << 20, COMPARE_CHUNK = 1 << 20 };
#define NONE SIZE_MAX

typedef struct group {
    const char *base; /* a prefix of a file's path: not NUL-terminated */
    size_t base_len;
    size_t raw, json, npy; /* file indexes or NONE */
    size_t raw2;           /* a second raw file claiming the same base (x and x.raw) */
} group;

/* What a sidecar, an .npy header or a source tensor says about a tensor. */
typedef struct meta {
    bool has_dtype, has_shape, has_name, bad;
    ckpt_dtype dtype;
    uint32_t ndim;
    uint64_t shape[CKPT_MAX_DIMS];
    const char *name;
    size_t name_len;
    uint64_t data_offset; /* .npy: where the bytes start */
} meta;

/* How one tensor enters the catalog. */
typedef struct plan {
    meta m;                 /* dtype, shape (and the name, in name/name_len below) */
    const staged_file *src; /* the file holding the bytes */
    uint64_t offset;        /* where they start in it */
    const char *name;
    size_t name_len;
    const ckpt_tensor *extra_of; /* an unchanged source tensor, whose sidecar extras it keeps */
    const char *where;           /* path for messages */
    size_t raw, json;            /* the group's raw file and sidecar (indexes or NONE) */
} plan;

typedef struct builder {
    const staged_file *files;
    size_t nfiles;
    const ckpt_catalog *lower;
    staged_report *rep;
    ckpt_err *err;
    int fatal; /* a negative errno once the check itself failed */
    arena mem;
    hashmap by_path, by_base, by_name;
    group *groups;
    size_t ngroups, cap_groups;
    plan *plans;
    size_t nplans;
    size_t *aux; /* files carried as they are (is_aux) */
    size_t naux, cap_aux;
    unsigned char *buf_a, *buf_b;
    strbuf tmp;
} builder;

/* ---- report ---- */

static int push_line(char ***arr, size_t *n, size_t *cap, char *line) {
    if (GROW(*arr, *cap, *n + 1)) return -ENOMEM;
    (*arr)[(*n)++] = line;
    return 0;
}

/* Paths and names on one line: control bytes as \xNN. */
static void put_shown(strbuf *sb, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f) {
            char e[4] = {'\\', 'x', hex[c >> 4], hex[c & 15]};
            sb_put(sb, e, 4);
        } else {
            sb_putc(sb, (char)c);
        }
    }
}

static void oom(builder *b) {
    if (!b->fatal) b->fatal = ckpt_fail(b->err, -ENOMEM, "out of memory");
}

static void add_line(builder *b, bool is_problem, const char *path, size_t plen, const char *fmt,
                     ...) __attribute__((format(printf, 5, 6)));
static void add_line(builder *b, bool is_problem, const char *path, size_t plen, const char *fmt,
                     ...) {
    strbuf sb;
    sb_init(&sb);
    put_shown(&sb, path, plen);
    sb_puts(&sb, ": ");
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    put_shown(&sb, msg, strlen(msg)); /* paths quoted in the message, too */
    size_t len;
    char *line = sb_take(&sb, &len);
    staged_report *r = b->rep;
    if (!line || (is_problem ? push_line(&r->problems, &r->nproblems, &r->cap_problems, line)
                             : push_line(&r->notes, &r->nnotes, &r->cap_notes, line))) {
        free(line);
        oom(b);
    }
}

#define problem(b, path, ...) add_line(b, true, path, strlen(path), __VA_ARGS__)

/* A name inside a message: control bytes (and NUL) escaped, long names cut. The text lives in
 * b->tmp until its next use, so one per message. */
static const char *shown_name(builder *b, const char *name, size_t len) {
    sb_clear(&b->tmp);
    put_shown(&b->tmp, name, len > 120 ? 120 : len);
    if (len > 120) sb_puts(&b->tmp, "...");
    return b->tmp.failed ? "?" : b->tmp.data;
}

static void format_shape(char *out, size_t cap, const uint64_t *shape, uint32_t ndim) {
    size_t at = (size_t)snprintf(out, cap, "[");
    for (uint32_t d = 0; d < ndim && at < cap; d++)
        at += (size_t)snprintf(out + at, cap - at, "%s%llu", d ? ", " : "",
                               (unsigned long long)shape[d]);
    if (at < cap) snprintf(out + at, cap - at, "]");
}

void staged_report_free(staged_report *rep) {
    for (size_t i = 0; i < rep->nproblems; i++) free(rep->problems[i]);
    for (size_t i = 0; i < rep->nnotes; i++) free(rep->notes[i]);
    free(rep->problems);
    free(rep->notes);
    free(rep->file_tensor);
    free(rep->file_tensor_len);
    memset(rep, 0, sizeof *rep);
}

/* ---- reading staged bytes ---- */

typedef struct reader {
    int fd;               /* spool file, or -1 */
    const ckpt_tensor *t; /* a source tensor */
    uint64_t base;        /* offset of byte 0 */
} reader;

static int reader_open(builder *b, const staged_file *f, uint64_t base, reader *r) {
    *r = (reader){.fd = -1, .base = base};
    if (f->origin == STAGED_LOWER_RAW) {
        r->t = &b->lower->tensors[f->lower];
        return 0;
    }
    r->base = base + f->spool_offset;
    r->fd = open(f->spool_path, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0) {
        int e = errno;
        problem(b, f->path, "cannot open its staged bytes (%s): %s", f->spool_path, strerror(e));
        return -e;
    }
    return 0;
}

static void reader_close(reader *r) {
    if (r->fd >= 0) close(r->fd);
    r->fd = -1;
}

static int pread_full(int fd, void *buf, size_t len, uint64_t off) {
    size_t got = 0;
    while (got < len) {
        ssize_t n = pread(fd, (char *)buf + got, len - got, (off_t)(off + got));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -errno;
        if (n == 0) return -EIO; /* shorter than it said */
        got += (size_t)n;
    }
    return 0;
}

static int reader_read(const builder *b, const reader *r, uint64_t off, void *buf, size_t len) {
    if (r->fd >= 0) return pread_full(r->fd, buf, len, r->base + off);
    size_t got = 0;
    while (got < len) {
        ckpt_segment seg[32];
        uint64_t done;
        size_t n = ckpt_plan(r->t, off + got, len - got, seg, 32, &done);
        if (n == 0) return -EIO;
        /* Through the source layer: a .zst source's fd holds compressed bytes. */
        int e = ckpt_read_segments(b->lower, seg, n, (char *)buf + got, NULL);
        if (e) return e;
        got += (size_t)done;
    }
    return 0;
}

/* ---- what files say ---- */

static bool same_layout(const meta *x, const meta *y) {
    return x->dtype == y->dtype && x->ndim == y->ndim &&
           memcmp(x->shape, y->shape, x->ndim * sizeof *x->shape) == 0;
}

static bool meta_nbytes(const meta *m, uint64_t *nbytes) {
    uint64_t numel;
    return catalog_shape_nbytes(m->shape, m->ndim, m->dtype, &numel, nbytes);
}

static void meta_of_lower(const ckpt_tensor *t, meta *m) {
    memset(m, 0, sizeof *m);
    m->has_dtype = m->has_shape = true;
    m->dtype = t->dtype;
    m->ndim = t->ndim;
    memcpy(m->shape, t->shape, t->ndim * sizeof *t->shape);
}

static void read_sidecar(builder *b, const staged_file *f, meta *m) {
    memset(m, 0, sizeof *m);
    if (f->origin == STAGED_LOWER_SIDECAR) {
        const ckpt_tensor *t = &b->lower->tensors[f->lower];
        meta_of_lower(t, m);
        /* A source's sidecar names its tensor only where the source put it. */
        if (ckpt_is_sidecar_path(t, f->path, strlen(f->path))) {
            m->has_name = true;
            m->name = t->name;
            m->name_len = t->name_len;
        }
        return;
    }
    if (f->origin != STAGED_SPOOL) { /* a source tensor's raw bytes named x.json */
        m->bad = true;
        problem(b, f->path, "holds raw tensor bytes, not a sidecar");
        return;
    }
    m->bad = true;
    if (f->size > SIDECAR_MAX) {
        problem(b, f->path, "%llu bytes: too large for a sidecar (at most 16 MiB)",
                (unsigned long long)f->size);
        return;
    }
    char *text = malloc(f->size ? f->size : 1);
    if (!text) {
        oom(b);
        return;
    }
    reader r;
    int rc = reader_open(b, f, 0, &r);
    if (!rc && (rc = reader_read(b, &r, 0, text, f->size)))
        problem(b, f->path, "cannot read it: %s", strerror(-rc));
    reader_close(&r);
    json_doc doc;
    json_error jerr;
    if (rc) {
        free(text);
        return;
    }
    rc = json_parse(&doc, text, f->size, &jerr);
    if (rc == -ENOMEM) {
        oom(b);
    } else if (rc) {
        problem(b, f->path, "not valid JSON: %s at offset %zu", jerr.msg, jerr.pos);
    } else if (doc.root->type != JSON_OBJECT) {
        problem(b, f->path, "the sidecar is %s, not a JSON object", json_type_desc(doc.root->type));
    } else {
        m->bad = false;
        const json_value *v;
        if ((v = json_member(doc.root, "dtype"))) {
            if (v->type != JSON_STRING) {
                problem(b, f->path, "\"dtype\" is %s, not a string", json_type_desc(v->type));
                m->bad = true;
            } else if (!ckpt_dtype_parse(v->str, v->len, &m->dtype)) {
                problem(b, f->path,
                        "\"dtype\" \"%s\" is not a dtype ckptfs knows (F32, F16, "
                        "BF16, I64, U8, BOOL, F8_E4M3, Q4_0, ... as in ckptfs(5))",
                        shown_name(b, v->str, v->len));
                m->bad = true;
            } else {
                m->has_dtype = true;
            }
        }
        if ((v = json_member(doc.root, "shape"))) {
            bool ok = v->type == JSON_ARRAY && v->count <= CKPT_MAX_DIMS;
            uint32_t d = 0;
            for (const json_value *e = ok ? v->head : NULL; e && ok; e = e->next)
                ok = json_as_u64(e, &m->shape[d++]);
            if (!ok) {
                problem(b, f->path,
                        "\"shape\" is not an array of at most 32 non-negative "
                        "integers");
                m->bad = true;
            } else {
                m->ndim = d;
                m->has_shape = true;
            }
        }
        if ((v = json_member(doc.root, "name"))) {
            if (v->type != JSON_STRING) {
                problem(b, f->path, "\"name\" is %s, not a string", json_type_desc(v->type));
                m->bad = true;
            } else if (!(m->name = arena_memdup(&b->mem, v->str, v->len))) {
                oom(b);
            } else {
                m->name_len = v->len;
                m->has_name = true;
            }
        }
        if ((v = json_member(doc.root, "byte_order")) && !json_str_eq(v, "little")) {
            problem(b, f->path,
                    "\"byte_order\" is not \"little\" (staged bytes are "
                    "little-endian)");
            m->bad = true;
        }
        json_doc_free(&doc);
    }
    free(text);
}

static void read_npy(builder *b, const staged_file *f, meta *m) {
    memset(m, 0, sizeof *m);
    m->bad = true;
    if (f->origin != STAGED_SPOOL) {
        problem(b, f->path, "is not an .npy file (it holds a source tensor's %s)",
                f->origin == STAGED_LOWER_RAW ? "bytes" : "sidecar");
        return;
    }
    size_t want = f->size < NPY_MAX_HEADER + 12 ? (size_t)f->size : NPY_MAX_HEADER + 12;
    unsigned char *head = malloc(want ? want : 1);
    if (!head) {
        oom(b);
        return;
    }
    reader r;
    int rc = reader_open(b, f, 0, &r);
    if (!rc && (rc = reader_read(b, &r, 0, head, want)))
        problem(b, f->path, "cannot read it: %s", strerror(-rc));
    reader_close(&r);
    npy_header npy;
    char why[256];
    if (!rc && (rc = npy_header_parse(head, want, &npy, why, sizeof why)) != 0)
        problem(b, f->path, "%s", why);
    if (!rc && npy.fortran_order) {
        problem(b, f->path,
                "header field 'fortran_order' is True (stage C-ordered arrays: "
                "numpy.ascontiguousarray)");
        rc = -EINVAL;
    }
    free(head);
    if (rc) return;
    m->bad = false;
    m->has_dtype = m->has_shape = true;
    m->dtype = npy.dtype;
    m->ndim = npy.ndim;
    memcpy(m->shape, npy.shape, npy.ndim * sizeof *npy.shape);
    m->data_offset = npy.data_offset;
    uint64_t nbytes;
    char shape[400];
    format_shape(shape, sizeof shape, m->shape, m->ndim);
    if (!meta_nbytes(m, &nbytes)) {
        problem(b, f->path, "shape %s of %s overflows", shape, ckpt_dtype_info_of(m->dtype)->name);
        m->bad = true;
    } else if (f->size - npy.data_offset != nbytes) {
        problem(b, f->path, "%llu data bytes after the header, but %s %s takes %llu",
                (unsigned long long)(f->size - npy.data_offset), ckpt_dtype_info_of(m->dtype)->name,
                shape, (unsigned long long)nbytes);
        m->bad = true;
    }
}

static uint64_t file_size(const builder *b, const staged_file *f) {
    return f->origin == STAGED_LOWER_RAW ? b->lower->tensors[f->lower].nbytes : f->size;
}

/* Compares nbytes of x (from xoff) with y (from yoff); reports where they differ. */
static bool same_bytes(builder *b, const staged_file *x, uint64_t xoff, const staged_file *y,
                       uint64_t yoff, uint64_t nbytes, uint64_t *differ_at) {
    reader rx, ry;
    if (reader_open(b, x, xoff, &rx)) return false;
    if (reader_open(b, y, yoff, &ry)) {
        reader_close(&rx);
        return false;
    }
    bool same = true;
    *differ_at = UINT64_MAX;
    for (uint64_t off = 0; off < nbytes && same;) {
        size_t n = nbytes - off < COMPARE_CHUNK ? (size_t)(nbytes - off) : COMPARE_CHUNK;
        int rc = reader_read(b, &rx, off, b->buf_a, n);
        if (!rc) rc = reader_read(b, &ry, off, b->buf_b, n);
        if (rc) {
            problem(b, y->path, "cannot read it: %s", strerror(-rc));
            same = false;
            break;
        }
        if (memcmp(b->buf_a, b->buf_b, n) != 0) {
            size_t i = 0;
            while (b->buf_a[i] == b->buf_b[i]) i++;
            *differ_at = off + i;
            same = false;
        }
        off += n;
    }
    reader_close(&rx);
    reader_close(&ry);
    return same;
}

/* ---- grouping ---- */

static bool hidden(const char *path) {
    if (path[0] == '.') return true;
    for (const char *p = path; (p = strchr(p, '/')); p++)
        if (p[1] == '.') return true;
    return false;
}

/* The path ends in suffix after a name of at least one byte. */
static bool ends_with(const char *s, size_t n, const char *suffix) {
    size_t m = strlen(suffix);
    return n > m && text_mem_ends_with(s, n, suffix) && s[n - m - 1] != '/';
}

static bool exists_with_suffix(builder *b, const char *path, size_t len, const char *suffix) {
    sb_clear(&b->tmp);
    sb_put(&b->tmp, path, len);
    sb_puts(&b->tmp, suffix);
    return !b->tmp.failed && hm_get(&b->by_path, b->tmp.data, b->tmp.len) != NULL;
}

static group *group_of(builder *b, const char *base, size_t len) {
    bool added;
    hm_entry *e = hm_put(&b->by_base, base, len, b->ngroups, &added);
    if (!e) return NULL;
    if (!added) return &b->groups[e->value];
    if (GROW(b->groups, b->cap_groups, b->ngroups + 1)) return NULL;
    group *g = &b->groups[b->ngroups++];
    *g = (group){base, len, NONE, NONE, NONE, NONE};
    return g;
}

/* config.json, tokenizer.json, ... at the top of the tree: a Hugging Face folder's own files,
 * carried as they are (unless config.json describes a raw file "config" beside it). */
static bool is_aux(builder *b, const char *path, size_t n) {
    if (strchr(path, '/')) return false;
    bool known = false;
    for (size_t i = 0; !known && i < ckpt_hf_aux_count; i++)
        known = strcmp(path, ckpt_hf_aux_names[i]) == 0;
    if (!known) return false;
    if (b->files[hm_get(&b->by_path, path, n)->value].origin != STAGED_SPOOL) return false;
    if (!ends_with(path, n, ".json")) return true;
    return !hm_get(&b->by_path, path, n - 5) && !exists_with_suffix(b, path, n - 5, ".npy");
}

static int group_files(builder *b) {
    size_t hidden_count = 0;
    for (size_t i = 0; i < b->nfiles; i++) {
        bool added;
        const char *p = b->files[i].path;
        if (!hm_put(&b->by_path, p, strlen(p), i, &added)) return -ENOMEM;
    }
    for (size_t i = 0; i < b->nfiles && !b->fatal; i++) {
        const char *p = b->files[i].path;
        size_t n = strlen(p);
        if (hidden(p)) {
            if (hidden_count++ < 10) add_line(b, false, p, n, "ignored (a hidden file)");
            continue;
        }
        if (is_aux(b, p, n)) {
            if (b->naux == b->cap_aux) {
                size_t c = b->cap_aux ? b->cap_aux * 2 : 8;
                size_t *a = realloc(b->aux, c * sizeof *a);
                if (!a) return -ENOMEM;
                b->aux = a;
                b->cap_aux = c;
            }
            b->aux[b->naux++] = i;
            continue;
        }
        group *g;
        /* x is raw data when x.json or x.npy describes it, whatever its own name. */
        bool described =
            exists_with_suffix(b, p, n, ".json") || exists_with_suffix(b, p, n, ".npy");
        if (!described && ends_with(p, n, ".json")) {
            if (!(g = group_of(b, p, n - 5))) return -ENOMEM;
            g->json = i;
        } else if (!described && ends_with(p, n, ".npy")) {
            if (!(g = group_of(b, p, n - 4))) return -ENOMEM;
            g->npy = i;
        } else {
            size_t base = !described && ends_with(p, n, ".raw") ? n - 4 : n;
            if (!(g = group_of(b, p, base))) return -ENOMEM;
            if (g->raw == NONE)
                g->raw = i;
            else
                g->raw2 = i;
        }
    }
    if (hidden_count > 10) {
        char msg[64];
        snprintf(msg, sizeof msg, "%zu hidden files in all", hidden_count);
        add_line(b, false, ".", 1, "%s", msg);
    }
    return b->fatal;
}

/* ---- one tensor ---- */

static const char *path_of(const builder *b, size_t i) {
    return b->files[i].path;
}

static void plan_group(builder *b, const group *g) {
    const staged_file *raw = g->raw != NONE ? &b->files[g->raw] : NULL;
    const staged_file *js = g->json != NONE ? &b->files[g->json] : NULL;
    const staged_file *np = g->npy != NONE ? &b->files[g->npy] : NULL;
    if (g->raw2 != NONE) {
        problem(b, path_of(b, g->raw2), "holds the bytes of the same tensor as %s",
                shown_name(b, raw->path, strlen(raw->path)));
        return;
    }
    if (!raw && !np) {
        char base[4096];
        snprintf(base, sizeof base, "%.*s", (int)g->base_len, g->base);
        problem(b, js->path, "a sidecar without its data (expected %s or %s.npy)",
                shown_name(b, base, strlen(base)), base);
        return;
    }
    if (raw && !js && !np) {
        problem(b, raw->path,
                "no sidecar %s.json with \"dtype\" and \"shape\" (or give the "
                "tensor as %s.npy)",
                raw->path, raw->path);
        return;
    }
    meta side = {0}, npy = {0};
    if (js) read_sidecar(b, js, &side);
    if (np) read_npy(b, np, &npy);
    if (side.bad || npy.bad || b->fatal) return;

    plan p = {0};
    char shape[400], other_shape[400];
    if (raw && js) {
        /* raw bytes + sidecar: the sidecar must give dtype and shape, the bytes must fit. */
        if (!side.has_dtype || !side.has_shape) {
            problem(b, js->path, "no \"%s\" (a sidecar gives \"dtype\" and \"shape\")",
                    side.has_dtype ? "shape" : "dtype");
            return;
        }
        uint64_t nbytes;
        format_shape(shape, sizeof shape, side.shape, side.ndim);
        if (!meta_nbytes(&side, &nbytes)) {
            problem(b, js->path, "shape %s of %s overflows or is not a whole number of bytes",
                    shape, ckpt_dtype_info_of(side.dtype)->name);
            return;
        }
        uint64_t size = file_size(b, raw);
        if (size != nbytes) {
            problem(b, raw->path, "%llu bytes, but %s %s (from %s) takes %llu",
                    (unsigned long long)size, ckpt_dtype_info_of(side.dtype)->name, shape, js->path,
                    (unsigned long long)nbytes);
            return;
        }
        p.m = side;
        p.src = raw;
        if (np) { /* the copy a mount shows next to them: must be the same tensor */
            format_shape(other_shape, sizeof other_shape, npy.shape, npy.ndim);
            uint64_t at;
            if (!same_layout(&side, &npy)) {
                problem(b, np->path, "clashes with %s + %s: %s %s here, %s %s there", raw->path,
                        js->path, ckpt_dtype_info_of(npy.dtype)->name, other_shape,
                        ckpt_dtype_info_of(side.dtype)->name, shape);
                return;
            }
            if (!same_bytes(b, raw, 0, np, npy.data_offset, nbytes, &at)) {
                if (at != UINT64_MAX)
                    problem(b, np->path, "clashes with %s: the bytes differ at data offset %llu",
                            raw->path, (unsigned long long)at);
                return;
            }
        }
    } else {
        /* the .npy defines the tensor; a sidecar may name it, a raw file must agree */
        p.m = npy;
        p.src = np;
        p.offset = npy.data_offset;
        format_shape(shape, sizeof shape, npy.shape, npy.ndim);
        if (js && ((side.has_dtype && side.dtype != npy.dtype) ||
                   (side.has_shape &&
                    (side.ndim != npy.ndim ||
                     memcmp(side.shape, npy.shape, npy.ndim * sizeof *npy.shape) != 0)))) {
            format_shape(other_shape, sizeof other_shape, side.shape, side.ndim);
            problem(b, js->path, "clashes with %s: %s %s there", np->path,
                    ckpt_dtype_info_of(npy.dtype)->name, shape);
            return;
        }
        if (raw) {
            uint64_t nbytes = np->size - npy.data_offset, at;
            if (file_size(b, raw) != nbytes) {
                problem(b, raw->path, "clashes with %s: %llu bytes here, %llu there", np->path,
                        (unsigned long long)file_size(b, raw), (unsigned long long)nbytes);
                return;
            }
            if (!same_bytes(b, np, npy.data_offset, raw, 0, nbytes, &at)) {
                if (at != UINT64_MAX)
                    problem(b, raw->path, "clashes with %s: the bytes differ at offset %llu",
                            np->path, (unsigned long long)at);
                return;
            }
        }
        if (js) {
            p.m.has_name = side.has_name;
            p.m.name = side.name;
            p.m.name_len = side.name_len;
        }
    }
    p.where = p.src->path;
    p.raw = g->raw;
    p.json = g->json;

    /* An unchanged source tensor keeps its format's sidecar extras. */
    if (raw && js && raw->origin == STAGED_LOWER_RAW && js->origin == STAGED_LOWER_SIDECAR &&
        raw->lower == js->lower)
        p.extra_of = &b->lower->tensors[raw->lower];

    /* The name: the sidecar's, where the file sits at that name's path; else the path's. */
    if (p.m.has_name && staged_path_shows_name(g->base, g->base_len, p.m.name, p.m.name_len)) {
        p.name = p.m.name;
        p.name_len = p.m.name_len;
    } else if (p.m.has_name && js && js->origin == STAGED_LOWER_SIDECAR) {
        p.name = p.m.name; /* a source tensor where the source shows it (under a prefix) */
        p.name_len = p.m.name_len;
    } else {
        strbuf nm;
        sb_init(&nm);
        if (!staged_name_from_path(g->base, g->base_len, &nm)) {
            sb_free(&nm);
            problem(b, p.where,
                    "its path abbreviates a long name (%%#...): give the whole name "
                    "as \"name\" in a sidecar %.*s.json",
                    (int)g->base_len, g->base);
            return;
        }
        p.name = nm.failed ? NULL : arena_memdup(&b->mem, nm.data ? nm.data : "", nm.len);
        p.name_len = nm.len;
        sb_free(&nm);
        if (!p.name) {
            oom(b);
            return;
        }
    }

    /* Bytes of a source tensor under another dtype or shape: only a contiguous one can be. */
    if (p.src->origin == STAGED_LOWER_RAW) {
        const ckpt_tensor *t = &b->lower->tensors[p.src->lower];
        meta lm;
        meta_of_lower(t, &lm);
        bool whole = t->npieces == 1 && !t->pieces[0].strides && !t->index;
        for (uint32_t d = 0; whole && d < t->ndim; d++)
            whole = t->pieces[0].offsets[d] == 0 && t->pieces[0].sizes[d] == t->shape[d];
        if (!same_layout(&lm, &p.m) && !whole) {
            problem(b, p.where,
                    "its bytes are source tensor \"%s\", stored in pieces, which "
                    "cannot take another dtype or shape in place (copy the file with cp to "
                    "stage its bytes)",
                    shown_name(b, t->name, t->name_len));
            return;
        }
    }

    bool added;
    hm_entry *e = hm_put(&b->by_name, p.name, p.name_len, b->nplans, &added);
    if (!e) {
        oom(b);
        return;
    }
    if (!added) {
        problem(b, p.where, "tensor name \"%s\" is already given by %s",
                shown_name(b, p.name, p.name_len), b->plans[e->value].where);
        return;
    }
    b->plans[b->nplans++] = p;
}

/* ---- the catalog ---- */

static int add_plan(builder *b, ckpt_catalog *cat, const plan *p, uint32_t *lower_src) {
    size_t idx;
    int rc = catalog_add_tensor(cat, p->name, p->name_len, p->m.dtype, p->m.ndim, p->m.shape, &idx,
                                b->err);
    if (rc) return rc;
    const size_t given[] = {(size_t)(p->src - b->files), p->raw, p->json};
    for (size_t k = 0; k < 3; k++)
        if (given[k] != NONE) {
            b->rep->file_tensor[given[k]] = cat->tensors[idx].name;
            b->rep->file_tensor_len[given[k]] = cat->tensors[idx].name_len;
        }
    if (p->extra_of && p->extra_of->extra) {
        strbuf extra;
        sb_init(&extra);
        ckpt_tensor_extra(p->extra_of, &extra);
        rc = extra.failed || !sb_reserve(&extra, 1) ? ckpt_fail(b->err, -ENOMEM, "out of memory")
                                                    : 0;
        if (!rc) {
            extra.data[extra.len] = '\0';
            rc = catalog_set_extra(cat, idx, extra.data, b->err);
        }
        sb_free(&extra);
        if (rc) return rc;
    }
    const staged_file *f = p->src;
    if (f->origin == STAGED_SPOOL) {
        uint32_t src;
        if ((rc = catalog_add_source(cat, f->spool_path, f->path, &src, b->err))) return rc;
        /* One file per staged tensor: 100k of them would be 100k descriptors held open
         * for the whole commit. Opened for each read instead (the writer reads each once). */
        ckpt_source *s = &cat->sources[src];
        /* The spool is private (0600) by design: the bytes in it were written by the user, so
         * they do not make the commit's output narrower than its lower sources. */
        s->mode |= 07777;
        s->owned = true; /* the stage appends to its pack while a commit reads from it */
        if (!s->zst) {
            close(s->fd);
            s->fd = -1;
        }
        return catalog_add_piece(cat, idx, src, f->spool_offset + p->offset, NULL, NULL, NULL,
                                 b->err);
    }
    const ckpt_tensor *t = &b->lower->tensors[f->lower];
    for (uint32_t k = 0; k < t->npieces; k++) {
        uint32_t ls = t->pieces[k].source;
        if (lower_src[ls] == UINT32_MAX) {
            const ckpt_source *s = &b->lower->sources[ls];
            /* The file the source catalog has open, not whatever the path names now: a
             * commit may have replaced it (--from OUT edits OUT in place). */
            char proc[64];
            snprintf(proc, sizeof proc, "/proc/self/fd/%d", s->fd);
            const char *rel = s->member_of ? s->member_of : s->relpath;
            if (catalog_add_source(cat, proc, rel, &lower_src[ls], b->err) != 0 &&
                (rc = catalog_add_source(cat, s->path, rel, &lower_src[ls], b->err)))
                return rc;
            if (s->member_of && (rc = catalog_add_member(cat, lower_src[ls], s->relpath, s->base,
                                                         s->size, &lower_src[ls], b->err)))
                return rc;
            const ckpt_source *now = &cat->sources[lower_src[ls]];
            /* unchanged() first: it takes a link made since (ctime and count) as s's own */
            if (!ckpt_source_unchanged(s) || now->size != s->size ||
                now->mtime.tv_sec != s->mtime.tv_sec || now->mtime.tv_nsec != s->mtime.tv_nsec ||
                now->ctime.tv_sec != s->ctime.tv_sec || now->ctime.tv_nsec != s->ctime.tv_nsec ||
                now->ino != s->ino)
                problem(b, s->path,
                        "the source file changed since the stage was mounted (the "
                        "staged tree refers to its old bytes)");
        }
        meta lm;
        meta_of_lower(t, &lm);
        const ckpt_piece *pc = &t->pieces[k];
        if (same_layout(&lm, &p->m))
            rc = catalog_add_piece(cat, idx, lower_src[ls], pc->file_offset, pc->offsets, pc->sizes,
                                   pc->strides, b->err);
        else /* one contiguous piece (checked in plan_group), read as the sidecar says */
            rc = catalog_add_piece(cat, idx, lower_src[ls], pc->file_offset, NULL, NULL, NULL,
                                   b->err);
        if (rc) return rc;
    }
    return 0;
}

static int build_catalog(builder *b, const char *root, ckpt_catalog **out) {
    ckpt_catalog *cat = catalog_new(root, "staged");
    if (!cat) return ckpt_fail(b->err, -ENOMEM, "out of memory");
    uint32_t nl = b->lower ? b->lower->nsources : 0;
    uint32_t *lower_src = malloc((nl ? nl : 1) * sizeof *lower_src);
    int rc = lower_src ? 0 : ckpt_fail(b->err, -ENOMEM, "out of memory");
    for (uint32_t i = 0; i < nl; i++) lower_src[i] = UINT32_MAX;
    for (size_t i = 0; !rc && i < b->nplans; i++) rc = add_plan(b, cat, &b->plans[i], lower_src);
    free(lower_src);
    for (size_t i = 0; !rc && i < b->naux; i++) {
        const staged_file *f = &b->files[b->aux[i]];
        uint32_t src;
        rc = catalog_add_source(cat, f->spool_path, f->path, &src, b->err);
        if (!rc) cat->sources[src].owned = true;
        /* as for tensors: the spool's 0600 is not the user's file's mode */
        if (!rc) cat->sources[src].mode |= 07777;
        if (!rc && !cat->sources[src].zst) { /* as for tensors: opened when read */
            close(cat->sources[src].fd);
            cat->sources[src].fd = -1;
        }
        if (!rc) rc = catalog_add_aux(cat, f->path, src, b->err);
    }
    if (!rc && !b->fatal && b->rep->nproblems == 0) rc = catalog_finish(cat, b->err);
    if (rc || b->fatal || b->rep->nproblems) {
        ckpt_close(cat);
        return rc ? rc : b->fatal;
    }
    *out = cat;
    return 0;
}

static int line_cmp(const void *x, const void *y) {
    return strcmp(*(char *const *)x, *(char *const *)y);
}

int staged_build(const staged_file *files, size_t nfiles, const ckpt_catalog *lower,
                 const char *root, ckpt_catalog **out, staged_report *rep, ckpt_err *err) {
    *out = NULL;
    memset(rep, 0, sizeof *rep);
    builder b = {.files = files, .nfiles = nfiles, .lower = lower, .rep = rep, .err = err};
    arena_init(&b.mem);
    sb_init(&b.tmp);
    int rc = 0;
    if (!hm_init(&b.by_path, nfiles) || !hm_init(&b.by_base, nfiles) ||
        !hm_init(&b.by_name, nfiles) ||
        !(b.plans = malloc((nfiles ? nfiles : 1) * sizeof *b.plans)) ||
        !(rep->file_tensor = calloc(nfiles ? nfiles : 1, sizeof *rep->file_tensor)) ||
        !(rep->file_tensor_len = calloc(nfiles ? nfiles : 1, sizeof *rep->file_tensor_len)) ||
        !(b.buf_a = malloc(COMPARE_CHUNK)) || !(b.buf_b = malloc(COMPARE_CHUNK)))
        rc = ckpt_fail(err, -ENOMEM, "out of memory");
    if (!rc) rc = group_files(&b);
    for (size_t i = 0; !rc && !b.fatal && i < b.ngroups; i++) plan_group(&b, &b.groups[i]);
    if (!rc && !b.fatal && rep->nproblems == 0) rc = build_catalog(&b, root, out);
    if (!rc) rc = b.fatal;
    if (rc == -ENOMEM && !err->msg[0]) ckpt_fail(err, -ENOMEM, "out of memory");
    if (!rc && rep->nproblems) rc = -EINVAL;
    if (rep->nproblems > 1) qsort(rep->problems, rep->nproblems, sizeof *rep->problems, line_cmp);
    if (!rc) {
        rep->ntensors = (*out)->ntensors;
        for (size_t i = 0; i < (*out)->ntensors; i++) rep->nbytes += (*out)->tensors[i].nbytes;
    }
    hm_free(&b.by_path);
    hm_free(&b.by_base);
    hm_free(&b.by_name);
    free(b.groups);
    free(b.plans);
    free(b.aux);
    free(b.buf_a);
    free(b.buf_b);
    sb_free(&b.tmp);
    arena_free(&b.mem);
    return rc;
}
