/* safetensors: u64 LE header length N, N bytes of JSON, then the data section. Validation
 * follows the reference reader: N <= 100,000,000; exact integers; known dtype spellings;
 * tensors sorted by data_offsets must tile the data section with no gap, overlap or trailing
 * byte; each byte length must equal numel x dtype bits / 8. Unknown dtypes are refused, as the
 * reference reader does, because their element size (and so their extent) is unknown. */
#include "safetensors.h"
#include "../util/le.h"

#include "../util/grow.h"
#include "../util/json.h"
#include "../util/strbuf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

enum { HEADER_LIMIT = 100000000 };

static bool probe(const unsigned char *head, size_t n, uint64_t size) {
    if (n < 10 || size < 10) return false;
    uint64_t hlen = le64(head);
    if (hlen < 2 || hlen > HEADER_LIMIT) return false;
    for (size_t i = 8; i < n; i++) {
        unsigned char c = head[i];
        if (c == '{') return true;
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return false;
    }
    return false;
}

/* Reads the root's members as they are parsed. A complaint about an entry waits for the end
 * of the document: a JSON error anywhere comes first, as when the whole header was parsed
 * before any entry was looked at. */
typedef struct reader {
    const ckpt_source *src;
    st_header *h;
    size_t cap;
    int rc; /* the first complaint about an entry, in err */
    ckpt_err *err;
} reader;

/* Byte offset in the file of a JSON position in the header. */
#define AT(pos) ((unsigned long long)(8 + (pos)))

static int bad_at(reader *r, const char *name, size_t len, size_t pos, const char *what) {
    return ckpt_fail(r->err, -EINVAL, "%s: tensor \"%.*s\": %s (byte offset %llu)", r->src->path,
                     SHOWN_NAME(name, len), what, AT(pos));
}

static int bad(reader *r, const json_value *t, size_t pos, const char *what) {
    return bad_at(r, t->key, t->key_len, pos, what);
}

/* Checks one tensor entry and copies what the catalog needs: the entry's values go when it
 * returns. */
static int parse_entry(reader *r, const json_value *t, st_entry *e) {
    if (t->type != JSON_OBJECT) return bad(r, t, t->pos, "entry is not a JSON object");
    const json_value *dt = json_member(t, "dtype");
    const json_value *shape = json_member(t, "shape");
    const json_value *offs = json_member(t, "data_offsets");
    if (!dt || dt->type != JSON_STRING) return bad(r, t, t->pos, "missing or non-string \"dtype\"");
    if (!ckpt_dtype_parse(dt->str, dt->len, &e->dtype) ||
        !ckpt_dtype_info_of(e->dtype)->safetensors) {
        char msg[96];
        snprintf(msg, sizeof msg, "unknown dtype \"%.*s\"", SHOWN(dt->len > 40 ? 40 : dt->len),
                 dt->str);
        return bad(r, t, dt->pos, msg);
    }
    if (!shape || shape->type != JSON_ARRAY)
        return bad(r, t, shape ? shape->pos : t->pos, "missing or non-array \"shape\"");
    if (shape->count > CKPT_MAX_DIMS) return bad(r, t, shape->pos, "shape has more than 32 dims");
    uint64_t dims[CKPT_MAX_DIMS];
    e->ndim = 0;
    for (const json_value *d = shape->head; d; d = d->next)
        if (!json_as_u64(d, &dims[e->ndim++]))
            return bad(r, t, d->pos, "shape entry is not a non-negative integer below 2^64");
    if (!offs || offs->type != JSON_ARRAY || offs->count != 2)
        return bad(r, t, offs ? offs->pos : t->pos, "data_offsets must be an array of 2 integers");
    if (!json_as_u64(offs->head, &e->begin) || !json_as_u64(offs->head->next, &e->end))
        return bad(r, t, offs->pos, "data_offsets entry is not a non-negative integer below 2^64");
    if (e->end < e->begin) return bad(r, t, offs->pos, "data_offsets end is before begin");
    uint64_t numel, nbytes;
    if (!catalog_shape_nbytes(dims, e->ndim, e->dtype, &numel, &nbytes))
        return bad(r, t, shape->pos, "shape product overflows or is not a whole number of bytes");
    if (e->end - e->begin != nbytes) {
        char msg[160];
        snprintf(msg, sizeof msg, "data_offsets span %llu bytes but shape and dtype need %llu",
                 (unsigned long long)(e->end - e->begin), (unsigned long long)nbytes);
        return bad(r, t, offs->pos, msg);
    }
    e->pos = (uint32_t)t->pos;
    e->offsets_pos = (uint32_t)offs->pos;
    e->name_len = t->key_len;
    e->name = arena_text(&r->h->names, t->key, t->key_len);
    e->shape = arena_alloc_aligned(&r->h->dims, (e->ndim ? e->ndim : 1) * sizeof *dims, 8);
    if (!e->name || !e->shape) return ckpt_fail(r->err, -ENOMEM, "out of memory");
    memcpy(e->shape, dims, e->ndim * sizeof *dims);
    return 0;
}

static int check_metadata(reader *r, const json_value *m) {
    if (m->type == JSON_NULL) return 0;
    if (m->type != JSON_OBJECT)
        return ckpt_fail(r->err, -EINVAL, "%s: __metadata__ is not an object (byte offset %llu)",
                         r->src->path, AT(m->pos));
    for (const json_value *kv = m->head; kv; kv = kv->next)
        if (kv->type != JSON_STRING)
            return ckpt_fail(r->err, -EINVAL,
                             "%s: __metadata__ value of \"%.*s\" is %s, not a string (byte "
                             "offset %llu)",
                             r->src->path, SHOWN_NAME(kv->key, kv->key_len),
                             json_type_desc(kv->type), AT(kv->pos));
    return 0;
}

static int read_member(void *ctx, const json_value *m) {
    reader *r = ctx;
    if (r->rc) return 0; /* one complaint is enough; the parse goes on for JSON errors */
    st_header *h = r->h;
    if (m->key_len == 12 && memcmp(m->key, "__metadata__", 12) == 0) {
        r->rc = check_metadata(r, m);
        h->metadata = m;
        return 0;
    }
    if (GROW(h->entries, r->cap, h->nentries + 1))
        return ckpt_fail(r->err, -ENOMEM, "out of memory");
    r->rc = parse_entry(r, m, &h->entries[h->nentries]);
    if (r->rc == -ENOMEM) return r->rc;
    if (!r->rc) h->nentries++;
    return 0;
}

static int entry_cmp(const void *a, const void *b) {
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin) return (x->begin > y->begin) - (x->begin < y->begin);
    return (x->end > y->end) - (x->end < y->end);
}

int safetensors_metadata_doc(ckpt_catalog *cat, uint32_t source, const st_header *h,
                             ckpt_err *err) {
    const json_value *m = h->metadata;
    if (!m || m->type != JSON_OBJECT) return 0;
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "{\"__metadata__\": {");
    for (const json_value *kv = m->head; kv; kv = kv->next) {
        if (kv != m->head) sb_puts(&sb, ", ");
        sb_json_str(&sb, kv->key, kv->key_len);
        sb_puts(&sb, ": ");
        sb_json_str(&sb, kv->str, kv->len);
    }
    sb_puts(&sb, "}}");
    int rc = sb.failed ? ckpt_fail(err, -ENOMEM, "out of memory")
                       : catalog_add_doc(cat, cat->sources[source].relpath, sb.data, sb.len, err);
    sb_free(&sb);
    return rc;
}

void safetensors_header_free(st_header *h) {
    free(h->entries);
    json_doc_free(&h->doc);
    arena_free(&h->names);
    arena_free(&h->dims);
    memset(h, 0, sizeof *h);
}

int safetensors_read_header(const ckpt_catalog *cat, uint32_t source, st_header *h, ckpt_err *err) {
    memset(h, 0, sizeof *h);
    const ckpt_source *src = &cat->sources[source];
    if (src->size < 8)
        return ckpt_fail(err, -EINVAL,
                         "%s: file is %llu bytes, too short for the 8-byte header "
                         "length at offset 0",
                         src->path, (unsigned long long)src->size);
    unsigned char lenbuf[8];
    int rc = ckpt_source_read(cat, source, 0, lenbuf, 8, "header length", err);
    if (rc) return rc;
    uint64_t hlen = le64(lenbuf);
    if (hlen > HEADER_LIMIT)
        return ckpt_fail(err, -EINVAL,
                         "%s: header length %llu at offset 0 exceeds the limit of "
                         "%d bytes",
                         src->path, (unsigned long long)hlen, HEADER_LIMIT);
    if (hlen > src->size - 8)
        return ckpt_fail(err, -EINVAL,
                         "%s: header length %llu at offset 0 runs past the end of "
                         "the file (size %llu)",
                         src->path, (unsigned long long)hlen, (unsigned long long)src->size);
    /* The text is mapped on its own, not taken from the heap: freed, it goes back at once
     * instead of leaving a hole below what the catalog allocates next (at a million tensors,
     * a 68 MiB hole that stayed in the peak of ls, info and a mount). */
    size_t map_len = hlen ? (size_t)hlen : 1;
    char *hdr = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (hdr == MAP_FAILED) return ckpt_fail(err, -ENOMEM, "out of memory");
    rc = ckpt_source_read(cat, source, 8, hdr, hlen, "header", err);
    if (rc) {
        munmap(hdr, map_len);
        return rc;
    }
    /* The members are read as they are parsed: the header's values never exist all at once,
     * and the text goes as soon as it is read (names and dims were copied, __metadata__ is
     * kept with its own text). */
    ckpt_err complaint;
    reader r = {.src = src, .h = h, .err = &complaint};
    json_error jerr;
    rc = json_stream_members(&h->doc, hdr, hlen, "__metadata__", read_member, &r, &jerr);
    munmap(hdr, map_len);
    if (rc == -ENOMEM && r.rc == -ENOMEM) {
        *err = complaint;
        goto out;
    }
    if (rc) {
        rc = ckpt_fail(err, rc, "%s: header JSON: %s (byte offset %llu)", src->path, jerr.msg,
                       AT(jerr.pos));
        goto out;
    }
    const json_value *root = h->doc.root;
    if (root->type != JSON_OBJECT) {
        rc = ckpt_fail(err, -EINVAL, "%s: header JSON is %s, not an object (byte offset %llu)",
                       src->path, json_type_desc(root->type), AT(root->pos));
        goto out;
    }
    if ((rc = r.rc)) {
        *err = complaint;
        goto out;
    }
    st_entry *entries = h->entries;
    size_t n = h->nentries;
    if (n > 1) qsort(entries, n, sizeof *entries, entry_cmp);
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const st_entry *e = &entries[i];
        if (e->begin != at) {
            char msg[160];
            snprintf(msg, sizeof msg,
                     "data_offsets begin at %llu but the previous tensor ends "
                     "at %llu (%s)",
                     (unsigned long long)e->begin, (unsigned long long)at,
                     e->begin > at ? "gap" : "overlap");
            r.err = err;
            rc = bad_at(&r, e->name, e->name_len, e->offsets_pos, msg);
            goto out;
        }
        at = e->end;
    }
    uint64_t data_start = 8 + hlen, data_len = src->size - data_start;
    if (at != data_len) {
        rc = ckpt_fail(err, -EINVAL,
                       "%s: data_offsets cover %llu bytes but the data section at "
                       "offset %llu has %llu (%s)",
                       src->path, (unsigned long long)at, (unsigned long long)data_start,
                       (unsigned long long)data_len,
                       at < data_len ? "trailing bytes" : "tensors run past the end of the file");
        goto out;
    }
    for (size_t i = 0; i < n; i++) entries[i].offset = data_start + entries[i].begin;
    h->data_start = data_start;
    return 0;
out:
    safetensors_header_free(h);
    return rc;
}

int safetensors_add_tensors(ckpt_catalog *cat, uint32_t source, const st_header *h, ckpt_err *err) {
    int rc = catalog_reserve_tensors(cat, h->nentries, err);
    for (size_t i = 0; !rc && i < h->nentries; i++) {
        const st_entry *e = &h->entries[i];
        size_t idx;
        rc = catalog_add_tensor(cat, e->name, e->name_len, e->dtype, e->ndim, e->shape, &idx, err);
        if (!rc) rc = catalog_add_piece(cat, idx, source, e->offset, NULL, NULL, NULL, err);
    }
    return rc ? rc : safetensors_metadata_doc(cat, source, h, err);
}

static int load(ckpt_catalog *cat, uint32_t source, ckpt_err *err) {
    st_header h;
    int rc = safetensors_read_header(cat, source, &h, err);
    if (rc) return rc;
    rc = safetensors_add_tensors(cat, source, &h, err);
    safetensors_header_free(&h);
    return rc;
}

static const char *const suffixes[] = {".safetensors", NULL};

const ckpt_format format_safetensors = {
    .name = "safetensors",
    .label = "safetensors",
    .probe = probe,
    .load = load,
    .suffixes = suffixes,
};
