/* LightwatchAI2 .lwt ("LWATCHV1"). No implementation or sample file of this format exists; its
 * only source is the project's contract document (docs/contracts/serialization.md), so this
 * reader follows the layout derived from it in the format notes (gptrs-burnpack-lwt-tp.md,
 * section 3) and accepts the other readings the document leaves open:
 *
 *   "LWATCHV1", header_len, header JSON, index of tensor_count entries, data section, CRC-32
 *   entry (natural C layout, 216 bytes): char name[128] (NUL-terminated), u32 ndim (0..8),
 *   4 padding bytes, u64 shape[8] (unused dims 0), u64 offset (from the data section start),
 *   u64 size_bytes (= 4 x numel: float32 is the only dtype the contract defines)
 *
 * Choices, one per ambiguity of sections 3.5 and 3.7 of the notes:
 *  1. header_len is u32 unless bytes 12..15 are all zero, then u64: JSON never starts with NUL,
 *     so a u32 prefix is followed by a non-zero byte and the rule cannot misread either width.
 *  2. No count prefix before the index; one (u32 or u64, equal to tensor_count) is accepted.
 *     The index may start right after the JSON or at the next multiple of 8.
 *  3. Entries are 216 bytes (the 4 padding bytes after ndim are ignored, whatever they hold);
 *     the packed 212-byte layout is accepted too.
 *     Every combination of 2 and 3 is a candidate layout, tried in that order (the natural one
 *     first); the first whose entries all check and whose data fits the file wins. When none
 *     does, the error is that of the candidate that got furthest, so a damaged natural file
 *     gets a message about the natural layout.
 *  4. The data section starts at the next 64-byte boundary of the file after the index; a
 *     section starting right after the index, or aligned relative to the index start, is
 *     accepted when it leaves exactly 0 or 4 trailing bytes and the natural start does not (a
 *     natural file cut short must not be read from right after its index, shifted). Each
 *     tensor offset must be a multiple of 64 or follow the previous entry's tensor directly (a
 *     contiguous writer): anything else is refused as misaligned, which is how a damaged
 *     offset is caught.
 *  5. CRC-32 is zlib's (IEEE 802.3), over the data section [start, start + max(offset +
 *     size_bytes)), padding between tensors included. It is read from a "crc32" header key
 *     (integer, or a hex string) and from a 4-byte LE trailer when exactly 4 bytes follow the
 *     data; every copy present must match, else the mount is refused. No copy: no check. Any
 *     other number of trailing bytes is a warning.
 *  6. total_bytes is compared with the sum of size_bytes and only warned about: the contract's
 *     own example number matches nothing.
 *  7. Shapes are shown as stored; whether Linear weights are [out,in] or HF's [in,out] is the
 *     writer's business, not the container's.
 *  8. Index order is kept as written; tensors may lie in any order in the data section. Names
 *     are unique (the catalog refuses duplicates) and lm_head is shown only when stored.
 *  9. A name has 1..127 bytes of UTF-8 and a NUL within name[128]; bytes after the NUL are
 *     ignored.
 * Header keys: version, if present, must be 1; tensor_count is required; dtype, if present,
 * must be "float32" and byte_order "little". The header goes to metadata.json verbatim with
 * the layout that was detected. */
#include "formats.h"
#include "../util/le.h"

#include "../util/json.h"
#include "../util/strbuf.h"
#include "../util/utf8.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

enum {
    HEADER_LIMIT = 100000000,
    NAME_FIELD = 128,
    MAX_NDIM = 8,
    ENTRY_NATURAL = 216,
    ENTRY_PACKED = 212,
    DATA_ALIGN = 64,
    MAX_CANDIDATES = 12,
};

static uint64_t align_up(uint64_t x, uint64_t a) {
    return x + (a - x % a) % a;
}

static bool probe(const unsigned char *head, size_t n, uint64_t file_size) {
    (void)file_size;
    return n >= 8 && memcmp(head, "LWATCHV1", 8) == 0;
}

/* One way of reading the index; see choices 2-4 above. */
typedef struct layout {
    uint64_t index_at;
    const char *count_prefix; /* "none", "u32", "u64" */
    uint32_t stride;
    uint64_t data_at, data_len;
    const char *data_align; /* "absolute", "none", "relative" */
    uint64_t progress;      /* entries checked, +1 when the data fits: picks the best error */
    ckpt_err err;
} layout;

typedef struct lwt {
    ckpt_catalog *cat;
    uint32_t source;
    const ckpt_source *src;
    uint64_t count;
    const unsigned char *win; /* the file from win_at: header end up to the largest index */
    uint64_t win_at, win_len;
    ckpt_err *err;
} lwt;

/* Field positions inside an entry of the given stride. */
static uint64_t shape_rel(uint32_t stride) {
    return stride == ENTRY_NATURAL ? 136 : 132;
}
static uint64_t offset_rel(uint32_t stride) {
    return shape_rel(stride) + 8 * MAX_NDIM;
}

typedef struct entry {
    const char *name;
    size_t name_len;
    uint32_t ndim;
    uint64_t shape[MAX_NDIM];
    uint64_t offset, size;
} entry;

static void put_shape(char *buf, size_t cap, const uint64_t *shape, uint32_t ndim) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (uint32_t i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%llu", i ? ", " : "",
                              (unsigned long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* Decodes and checks entry k of layout l; prev_end is where the previous entry's tensor ends. */
static int decode_entry(const lwt *f, layout *l, uint64_t k, uint64_t prev_end, entry *e) {
    const char *path = f->src->path;
    uint64_t at = l->index_at + k * l->stride;
    const unsigned char *p = f->win + (at - f->win_at);
    const unsigned char *nul = memchr(p, 0, NAME_FIELD);
    if (!nul)
        return ckpt_fail(&l->err, -EINVAL,
                         "%s: index entry %llu name at offset %llu has no NUL within its %d bytes",
                         path, (unsigned long long)k, (unsigned long long)at, NAME_FIELD);
    e->name = (const char *)p;
    e->name_len = (size_t)(nul - p);
    if (e->name_len == 0)
        return ckpt_fail(&l->err, -EINVAL, "%s: index entry %llu name at offset %llu is empty",
                         path, (unsigned long long)k, (unsigned long long)at);
    for (size_t i = 0; i < e->name_len;) {
        size_t n = utf8_seq_len(p + i, e->name_len - i);
        if (!n)
            return ckpt_fail(&l->err, -EINVAL,
                             "%s: index entry %llu name at offset %llu is not valid UTF-8 (byte "
                             "0x%02x at offset %llu)",
                             path, (unsigned long long)k, (unsigned long long)at, p[i],
                             (unsigned long long)(at + i));
        i += n;
    }
    const char *shown = ckpt_shown(e->name, e->name_len);
    int nl = -1; /* "%.*s" prints all of shown */
    e->ndim = le32(p + NAME_FIELD);
    if (e->ndim > MAX_NDIM)
        return ckpt_fail(&l->err, -EINVAL, "%s: tensor \"%.*s\": ndim %u at offset %llu exceeds %d",
                         path, nl, shown, e->ndim, (unsigned long long)(at + NAME_FIELD), MAX_NDIM);
    uint64_t shape_at = at + shape_rel(l->stride);
    for (uint32_t d = 0; d < MAX_NDIM; d++) {
        uint64_t v = le64(p + shape_rel(l->stride) + 8 * d);
        if (d < e->ndim)
            e->shape[d] = v;
        else if (v)
            return ckpt_fail(&l->err, -EINVAL,
                             "%s: tensor \"%.*s\": shape[%u] %llu at offset %llu is beyond ndim "
                             "%u and must be 0",
                             path, nl, shown, d, (unsigned long long)v,
                             (unsigned long long)(shape_at + 8 * d), e->ndim);
    }
    uint64_t off_at = at + offset_rel(l->stride);
    e->offset = le64(p + offset_rel(l->stride));
    e->size = le64(p + offset_rel(l->stride) + 8);
    uint64_t numel, nbytes;
    char shape[128];
    bool sized = catalog_shape_nbytes(e->shape, e->ndim, CKPT_F32, &numel, &nbytes);
    if (!sized || e->size != nbytes) put_shape(shape, sizeof shape, e->shape, e->ndim);
    if (!sized)
        return ckpt_fail(&l->err, -EINVAL,
                         "%s: tensor \"%.*s\": shape %s at offset %llu: the byte size overflows "
                         "64 bits",
                         path, nl, shown, shape, (unsigned long long)shape_at);
    if (e->size != nbytes)
        return ckpt_fail(&l->err, -EINVAL,
                         "%s: tensor \"%.*s\": size_bytes %llu at offset %llu does not match shape "
                         "%s of float32 (%llu bytes)",
                         path, nl, shown, (unsigned long long)e->size,
                         (unsigned long long)(off_at + 8), shape, (unsigned long long)nbytes);
    if (e->offset % DATA_ALIGN && e->offset != prev_end)
        return ckpt_fail(&l->err, -EINVAL,
                         "%s: tensor \"%.*s\": offset %llu at offset %llu is misaligned: neither a "
                         "multiple of %d nor the end of the previous tensor (%llu)",
                         path, nl, shown, (unsigned long long)e->offset, (unsigned long long)off_at,
                         DATA_ALIGN, (unsigned long long)prev_end);
    if (e->size > UINT64_MAX - e->offset)
        return ckpt_fail(&l->err, -EINVAL,
                         "%s: tensor \"%.*s\": offset %llu at offset %llu plus size_bytes %llu "
                         "overflows 64 bits",
                         path, nl, shown, (unsigned long long)e->offset, (unsigned long long)off_at,
                         (unsigned long long)e->size);
    return 0;
}

/* Checks every entry and places the data section; 0 when layout l reads the whole file. */
static int try_layout(const lwt *f, layout *l) {
    const char *path = f->src->path;
    uint64_t size = f->src->size;
    l->progress = 0;
    if (l->index_at > size || f->count > (size - l->index_at) / l->stride)
        return ckpt_fail(&l->err, -EINVAL,
                         "%s: index of %llu entries of %u bytes at offset %llu runs past the end "
                         "of the file (size %llu)",
                         path, (unsigned long long)f->count, l->stride,
                         (unsigned long long)l->index_at, (unsigned long long)size);
    uint64_t end = 0, prev_end = 0, last = 0;
    for (uint64_t k = 0; k < f->count; k++) {
        entry e;
        int rc = decode_entry(f, l, k, prev_end, &e);
        if (rc) return rc;
        prev_end = e.offset + e.size;
        if (prev_end > end) end = prev_end, last = k;
        l->progress++;
    }
    uint64_t index_end = l->index_at + f->count * l->stride;
    const struct {
        uint64_t at;
        const char *how;
    } starts[] = {{align_up(index_end, DATA_ALIGN), "absolute"},
                  {index_end, "none"},
                  {l->index_at + align_up(index_end - l->index_at, DATA_ALIGN), "relative"}};
    int fit = -1;
    for (int i = 0; i < 3; i++) {
        if (starts[i].at > size || end > size - starts[i].at) continue;
        uint64_t trailing = size - starts[i].at - end;
        bool exact = trailing == 0 || trailing == 4;
        /* Another start than the natural one must account for every byte: a natural file cut
         * short by less than its padding fits "right after the index" too, with every tensor
         * shifted by the padding that is read as data. */
        if (i > 0 && end && !exact) continue;
        if (fit < 0) fit = i;
        if (exact) {
            fit = i;
            break;
        }
    }
    if (fit < 0) {
        const unsigned char *p = f->win + (l->index_at + last * l->stride - f->win_at);
        return ckpt_fail(
            &l->err, -EINVAL,
            "%s: tensor \"%.*s\": offset %llu at offset %llu with size_bytes %llu "
            "runs past the end of the file (size %llu; the data section starts at "
            "offset %llu)",
            path, SHOWN_NAME((const char *)p, strnlen((const char *)p, NAME_FIELD)),
            (unsigned long long)le64(p + offset_rel(l->stride)),
            (unsigned long long)(l->index_at + last * l->stride + offset_rel(l->stride)),
            (unsigned long long)le64(p + offset_rel(l->stride) + 8), (unsigned long long)size,
            (unsigned long long)starts[0].at);
    }
    l->data_at = starts[fit].at;
    l->data_align = starts[fit].how;
    l->data_len = end;
    l->progress++;
    return 0;
}

/* CRC-32 of the data section, read in 1 MiB steps. */
static int data_crc(const lwt *f, const layout *l, uint32_t *crc) {
    enum { STEP = 1 << 20 };
    unsigned char *buf = malloc(STEP);
    if (!buf) return ckpt_fail(f->err, -ENOMEM, "out of memory");
    uLong c = crc32(0L, Z_NULL, 0);
    int rc = 0;
    for (uint64_t at = 0; at < l->data_len && !rc; at += STEP) {
        size_t n = l->data_len - at < STEP ? (size_t)(l->data_len - at) : STEP;
        rc = ckpt_source_read(f->cat, f->source, l->data_at + at, buf, n, "data section", f->err);
        if (!rc) c = crc32(c, buf, (uInt)n);
    }
    free(buf);
    *crc = (uint32_t)c;
    return rc;
}

/* The header's "crc32": an integer below 2^32, or a string of hex digits (optionally 0x). */
static int header_crc(const lwt *f, const json_value *v, uint64_t base, uint32_t *crc) {
    uint64_t x = 0;
    bool ok = json_as_u64(v, &x) && x <= UINT32_MAX;
    if (!ok && v->type == JSON_STRING && v->len > 0) {
        size_t i = v->len > 2 && v->str[0] == '0' && (v->str[1] == 'x' || v->str[1] == 'X') ? 2 : 0;
        ok = v->len - i >= 1 && v->len - i <= 8;
        for (x = 0; ok && i < v->len; i++) {
            char ch = v->str[i];
            int d = ch >= '0' && ch <= '9'   ? ch - '0'
                    : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                    : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                                             : -1;
            ok = d >= 0;
            x = x << 4 | (uint64_t)(d & 15);
        }
    }
    if (!ok)
        return ckpt_fail(f->err, -EINVAL,
                         "%s: header crc32 at offset %llu is not a 32-bit integer or hex string",
                         f->src->path, (unsigned long long)(base + v->pos));
    *crc = (uint32_t)x;
    return 0;
}

/* Header keys that must hold one value when present. */
static int check_header(lwt *f, const json_value *root, uint64_t base) {
    const char *path = f->src->path;
    if (root->type != JSON_OBJECT)
        return ckpt_fail(f->err, -EINVAL, "%s: header JSON at offset %llu is a%s %s, not an object",
                         path, (unsigned long long)(base + root->pos),
                         root->type == JSON_ARRAY ? "n" : "", json_type_name(root->type));
    const json_value *v = json_member(root, "version");
    uint64_t x;
    if (v && !(json_as_u64(v, &x) && x == 1))
        return ckpt_fail(f->err, -EINVAL,
                         "%s: header version (a %s%s%.*s) at offset %llu is not supported "
                         "(LWATCHV1 defines version 1)",
                         path, json_type_name(v->type), v->type == JSON_NUMBER ? ", " : "",
                         v->type == JSON_NUMBER ? SHOWN(v->len) : 0,
                         v->type == JSON_NUMBER ? v->str : "", (unsigned long long)(base + v->pos));
    v = json_member(root, "dtype");
    if (v && !json_str_eq(v, "float32"))
        return ckpt_fail(f->err, -EINVAL,
                         "%s: header dtype at offset %llu is not \"float32\", the only dtype of "
                         "LWATCHV1",
                         path, (unsigned long long)(base + v->pos));
    v = json_member(root, "byte_order");
    if (v && !json_str_eq(v, "little"))
        return ckpt_fail(f->err, -EINVAL, "%s: header byte_order at offset %llu is not \"little\"",
                         path, (unsigned long long)(base + v->pos));
    v = json_member(root, "tensor_count");
    if (!v || !json_as_u64(v, &f->count))
        return ckpt_fail(f->err, -EINVAL,
                         "%s: header tensor_count at offset %llu is %s, not a non-negative integer",
                         path, (unsigned long long)(base + (v ? v->pos : root->pos)),
                         v ? json_type_name(v->type) : "missing");
    return 0;
}

static int add_doc(lwt *f, const char *json, size_t json_len, const layout *l, bool width64,
                   const char *crc_where, uint32_t crc) {
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "{\"header\": ");
    sb_put(&sb, json, json_len);
    sb_printf(&sb,
              ", \"layout\": {\"header_len_width\": %d, \"index_offset\": %llu, "
              "\"count_prefix\": \"%s\", \"entry_size\": %u, \"data_offset\": %llu, "
              "\"data_alignment\": \"%s\", \"data_bytes\": %llu, \"crc32\": ",
              width64 ? 64 : 32, (unsigned long long)l->index_at, l->count_prefix, l->stride,
              (unsigned long long)l->data_at, l->data_align, (unsigned long long)l->data_len);
    if (crc_where)
        sb_printf(&sb, "{\"value\": \"0x%08x\", \"stored_in\": \"%s\", \"verified\": true}}}", crc,
                  crc_where);
    else
        sb_puts(&sb, "null}}");
    int rc = sb.failed ? ckpt_fail(f->err, -ENOMEM, "out of memory")
                       : catalog_add_doc(f->cat, "lightwatch-lwt", sb.data, sb.len, f->err);
    sb_free(&sb);
    return rc;
}

/* Builds the candidate layouts of choices 2 and 3 for an index that could start at from. */
static size_t candidates(const lwt *f, uint64_t from, layout *out) {
    uint64_t starts[6];
    const char *prefix[6];
    size_t n = 0;
    uint64_t bases[2] = {from, align_up(from, 8)};
    for (int b = 0; b < (bases[1] != bases[0] ? 2 : 1); b++) {
        uint64_t s = bases[b];
        starts[n] = s, prefix[n++] = "none";
        uint64_t win_end = f->win_at + f->win_len, room = s <= win_end ? win_end - s : 0;
        if (!f->count || room < 8) continue; /* too short for a prefix and an entry anyway */
        const unsigned char *p = f->win + (s - f->win_at);
        if (le32(p) == f->count) starts[n] = s + 4, prefix[n++] = "u32";
        if (le64(p) == f->count) starts[n] = s + 8, prefix[n++] = "u64";
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 2; k++) {
            memset(&out[m], 0, sizeof out[m]);
            out[m].index_at = starts[i];
            out[m].count_prefix = prefix[i];
            out[m++].stride = k == 0 ? ENTRY_NATURAL : ENTRY_PACKED;
        }
    return m;
}

static int load(ckpt_catalog *cat, uint32_t source, ckpt_err *err) {
    lwt f = {.cat = cat, .source = source, .src = &cat->sources[source], .err = err};
    const char *path = f.src->path;
    uint64_t size = f.src->size;
    unsigned char head[16] = {0};
    if (size < 12)
        return ckpt_fail(
            err, -EINVAL,
            "%s: header_len at offset 8 needs 4 bytes but the file ends at offset %llu", path,
            (unsigned long long)size);
    int rc = ckpt_source_read(cat, source, 0, head, size < 16 ? 12 : 16, "header_len", err);
    if (rc) return rc;
    bool width64 = size >= 16 && le32(head + 12) == 0;
    uint64_t hlen = width64 ? le64(head + 8) : le32(head + 8);
    uint64_t json_at = width64 ? 16 : 12;
    if (hlen > HEADER_LIMIT)
        return ckpt_fail(err, -EINVAL,
                         "%s: header_len %llu (u%d) at offset 8 exceeds the limit of %d bytes",
                         path, (unsigned long long)hlen, width64 ? 64 : 32, HEADER_LIMIT);
    if (hlen > size - json_at)
        return ckpt_fail(err, -EINVAL,
                         "%s: header_len %llu (u%d) at offset 8 runs past the end of the file "
                         "(size %llu)",
                         path, (unsigned long long)hlen, width64 ? 64 : 32,
                         (unsigned long long)size);
    char *json = malloc(hlen ? hlen : 1);
    unsigned char *win = NULL;
    if (!json) return ckpt_fail(err, -ENOMEM, "out of memory");
    json_doc doc;
    json_error jerr;
    bool have_doc = false;
    layout *cand = NULL;
    if ((rc = ckpt_source_read(cat, source, json_at, json, hlen, "header JSON", err))) goto out;
    if ((rc = json_parse(&doc, json, hlen, &jerr))) {
        rc = ckpt_fail(err, rc, "%s: header JSON: %s (byte offset %llu)", path, jerr.msg,
                       (unsigned long long)(json_at + jerr.pos));
        goto out;
    }
    have_doc = true;
    if ((rc = check_header(&f, doc.root, json_at))) goto out;
    uint64_t from = json_at + hlen;
    if (f.count > (size - from) / ENTRY_PACKED) {
        const json_value *v = json_member(doc.root, "tensor_count");
        rc = ckpt_fail(err, -EINVAL,
                       "%s: header tensor_count %llu at offset %llu needs at least %llu bytes of "
                       "index but %llu bytes follow the header",
                       path, (unsigned long long)f.count, (unsigned long long)(json_at + v->pos),
                       (unsigned long long)f.count * ENTRY_PACKED,
                       (unsigned long long)(size - from));
        goto out;
    }
    /* Every candidate index lies in [from, from + 16 + 216 x count) of the file. */
    f.win_at = from;
    f.win_len = size - from;
    if (f.win_len > 16 + ENTRY_NATURAL * f.count) f.win_len = 16 + ENTRY_NATURAL * f.count;
    win = malloc(f.win_len ? f.win_len : 1);
    if (!win) {
        rc = ckpt_fail(err, -ENOMEM, "out of memory");
        goto out;
    }
    if ((rc = ckpt_source_read(cat, source, f.win_at, win, f.win_len, "index", err))) goto out;
    f.win = win;
    cand = malloc(MAX_CANDIDATES * sizeof *cand);
    if (!cand) {
        rc = ckpt_fail(err, -ENOMEM, "out of memory");
        goto out;
    }
    size_t ncand = candidates(&f, from, cand), best = 0;
    const layout *l = NULL;
    for (size_t i = 0; i < ncand && !l; i++) {
        if (!try_layout(&f, &cand[i]))
            l = &cand[i];
        else if (cand[i].progress > cand[best].progress)
            best = i;
    }
    if (!l) {
        rc = -EINVAL;
        memcpy(err->msg, cand[best].err.msg, sizeof err->msg);
        goto out;
    }

    uint64_t trailing = size - l->data_at - l->data_len;
    const json_value *jcrc = json_member(doc.root, "crc32");
    uint32_t want_json = 0, got = 0;
    if (jcrc && (rc = header_crc(&f, jcrc, json_at, &want_json))) goto out;
    const char *where = jcrc && trailing == 4 ? "header+trailer"
                        : jcrc                ? "header"
                        : trailing == 4       ? "trailer"
                                              : NULL;
    if (where && (rc = data_crc(&f, l, &got))) goto out;
    if (jcrc && got != want_json) {
        rc = ckpt_fail(err, -EINVAL,
                       "%s: crc32 mismatch: header crc32 at offset %llu says 0x%08x but the data "
                       "section at offset %llu (%llu bytes) has 0x%08x",
                       path, (unsigned long long)(json_at + jcrc->pos), want_json,
                       (unsigned long long)l->data_at, (unsigned long long)l->data_len, got);
        goto out;
    }
    if (trailing == 4) {
        unsigned char t[4];
        uint64_t at = l->data_at + l->data_len;
        if ((rc = ckpt_source_read(cat, source, at, t, 4, "CRC-32 trailer", err))) goto out;
        if (le32(t) != got) {
            rc = ckpt_fail(err, -EINVAL,
                           "%s: crc32 mismatch: the CRC-32 trailer at offset %llu says 0x%08x but "
                           "the data section at offset %llu (%llu bytes) has 0x%08x",
                           path, (unsigned long long)at, le32(t), (unsigned long long)l->data_at,
                           (unsigned long long)l->data_len, got);
            goto out;
        }
    } else if (trailing) {
        catalog_warn(cat, "%s: %llu bytes after the data section (offset %llu) are ignored",
                     f.src->relpath, (unsigned long long)trailing,
                     (unsigned long long)(l->data_at + l->data_len));
    }

    uint64_t total = 0, prev_end = 0;
    for (uint64_t k = 0; k < f.count; k++) {
        entry e;
        layout again = *l; /* try_layout checked every entry: this decodes them once more */
        if ((rc = decode_entry(&f, &again, k, prev_end, &e))) {
            memcpy(err->msg, again.err.msg, sizeof err->msg);
            goto out;
        }
        prev_end = e.offset + e.size;
        if (__builtin_add_overflow(total, e.size, &total)) total = UINT64_MAX;
        size_t idx;
        rc = catalog_add_tensor(cat, e.name, e.name_len, CKPT_F32, e.ndim, e.shape, &idx, err);
        if (!rc)
            rc = catalog_add_piece(cat, idx, source, l->data_at + e.offset, NULL, NULL, NULL, err);
        if (rc) goto out;
    }
    const json_value *tb = json_member(doc.root, "total_bytes");
    uint64_t declared;
    if (tb && (!json_as_u64(tb, &declared) || declared != total))
        catalog_warn(cat, "%s: header total_bytes %.*s is not the sum of size_bytes (%llu)",
                     f.src->relpath, tb->type == JSON_NUMBER ? SHOWN(tb->len) : 1,
                     tb->type == JSON_NUMBER ? tb->str : "?", (unsigned long long)total);
    rc = add_doc(&f, json, hlen, l, width64, where, got);
out:
    free(cand);
    free(win);
    if (have_doc) json_doc_free(&doc);
    free(json);
    return rc;
}

const ckpt_format format_lwt = {
    .name = "lightwatch-lwt",
    .label = "LightwatchAI2",
    .probe = probe,
    .load = load,
    .integrity = "structure, and the CRC-32 of the data section when the file stores one",
};
