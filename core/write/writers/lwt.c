/* LightwatchAI2 .lwt ("LWATCHV1") writer, in the canonical layout of the format notes
 * (gptrs-burnpack-lwt-tp.md section 3.2, the natural reading of the contract document), which
 * is the first layout the ckptfs reader tries:
 *
 *   "LWATCHV1", u32 header_len, header JSON, tensor_count index entries of 216 bytes (no count
 *   prefix), zero padding to the next multiple of 64 of the file, the data section (each
 *   tensor at an offset that is a multiple of 64, zero padding between), u32 CRC-32 trailer
 *   entry: char name[128] (NUL-terminated, NUL-padded), u32 ndim (0..8), 4 zero bytes,
 *          u64 shape[8] (unused dims 0), u64 offset (from the data section), u64 size_bytes
 *
 * The CRC-32 (zlib's) covers the data section from its start to the end of the last tensor,
 * padding included. It is stored twice, as the notes propose: in the 4-byte trailer and as the
 * header's "crc32" (a decimal integer). Tensors are streamed, so the CRC is only known after
 * the data: it is computed by reading the data section back from the output (it is in the page
 * cache) and the header's value, written as 10 spaces-padded digits, is then filled in place.
 * A compressed output (.lwt.zst) can be neither read back nor patched: there the tensors are
 * read from their sources once before anything is written, for the CRC.
 *
 * Header keys: version 1, dtype "float32", byte_order "little", tensor_count, total_bytes (the
 * sum of size_bytes), source_format (where the tensors came from), crc32. From a .lwt source
 * every other key of its header (model_type, config, ...) is kept, in its order; other sources
 * have no model_type or config to give.
 *
 * Refused, naming the tensor: anything but F32 (the only dtype of LWATCHV1), more than 8 dims,
 * names that are empty, over 127 bytes, not UTF-8 or holding a NUL, incomplete tensors, and two
 * model tensors with one name. Tensors are written in catalog order (sorted by name). */
#include "writers.h"
#include "../../util/le.h"
#include "../../util/json_emit.h"

#include "../../model/catalog.h"
#include "../../util/json.h"
#include "../../util/strbuf.h"
#include "../../util/utf8.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

enum {
    NAME_FIELD = 128,
    MAX_NDIM = 8,
    ENTRY_SIZE = 216,
    DATA_ALIGN = 64,
    CRC_DIGITS = 10, /* 4294967295 */
    READ_BACK = 1 << 20,
};

static uint64_t align_up(uint64_t x) {
    return x + (DATA_ALIGN - x % DATA_ALIGN) % DATA_ALIGN;
}

/* ---- what may be written ---- */

static int check_tensor(const out_file *f, const ckpt_tensor *t, ckpt_err *err) {
    const char *out = f->final_path;
    const char *shown = ckpt_shown(t->name, t->name_len);
    int n = -1; /* "%.*s" prints all of shown */
    if (t->incomplete)
        return ckpt_fail(err, -EIO,
                         "%s: tensor \"%.*s\" is incomplete (part of it is stored nowhere)", out, n,
                         shown);
    if (t->dtype != CKPT_F32)
        return ckpt_fail(err, -EINVAL,
                         "%s: tensor \"%.*s\" is %s, which LWATCHV1 cannot hold (float32 only)",
                         out, n, shown, ckpt_dtype_info_of(t->dtype)->name);
    if (t->ndim > MAX_NDIM)
        return ckpt_fail(err, -EINVAL,
                         "%s: tensor \"%.*s\" has %u dims, more than the %d of an LWATCHV1 index "
                         "entry",
                         out, n, shown, t->ndim, MAX_NDIM);
    if (t->name_len == 0 || t->name_len >= NAME_FIELD)
        return ckpt_fail(err, -EINVAL,
                         "%s: tensor \"%.*s\": the name has %zu bytes; LWATCHV1 holds 1 to %d", out,
                         n, shown, t->name_len, NAME_FIELD - 1);
    const unsigned char *p = (const unsigned char *)t->name;
    for (size_t i = 0; i < t->name_len;) {
        size_t k = p[i] ? utf8_seq_len(p + i, t->name_len - i) : 0;
        if (!k)
            return ckpt_fail(err, -EINVAL,
                             "%s: tensor \"%.*s\": the name is not UTF-8 without NUL bytes "
                             "(byte 0x%02x at %zu), as an LWATCHV1 name must be",
                             out, n, shown, p[i], i);
        i += k;
    }
    return 0;
}

/* ---- header ---- */

static bool key_is(const json_value *m, const char *key) {
    return m->key_len == strlen(key) && memcmp(m->key, key, m->key_len) == 0;
}

/* Members of a .lwt source's header other than those this writer sets, each followed by ", ". */
static void put_source_keys(strbuf *sb, const ckpt_catalog *cat) {
    static const char *const own[] = {"version",     "dtype",         "byte_order", "tensor_count",
                                      "total_bytes", "source_format", "crc32"};
    const ckpt_doc *doc = NULL;
    for (size_t i = 0; i < cat->ndocs; i++)
        if (strcmp(cat->docs[i].key, "lightwatch-lwt") == 0) doc = &cat->docs[i];
    json_doc jd;
    json_error jerr;
    if (!doc || json_parse(&jd, doc->json, doc->len, &jerr)) return;
    const json_value *header = json_member(jd.root, "header");
    for (const json_value *m = header && header->type == JSON_OBJECT ? header->head : NULL; m;
         m = m->next) {
        bool mine = false;
        for (size_t k = 0; k < sizeof own / sizeof *own; k++) mine |= key_is(m, own[k]);
        if (mine) continue;
        sb_json_str(sb, m->key, m->key_len);
        sb_puts(sb, ": ");
        json_emit(sb, m, true, NULL);
        sb_puts(sb, ", ");
    }
    json_doc_free(&jd);
}

/* The header JSON with crc as its crc32; *crc_at is where the CRC's digits are in it. */
static void build_header(strbuf *sb, const ckpt_catalog *cat, size_t n, uint64_t total,
                         uint32_t crc, size_t *crc_at) {
    sb_puts(sb, "{\"version\": 1, ");
    put_source_keys(sb, cat);
    const char *fmt = cat->format ? cat->format : "unknown";
    sb_printf(sb,
              "\"dtype\": \"float32\", \"byte_order\": \"little\", \"tensor_count\": %zu, "
              "\"total_bytes\": %llu, \"source_format\": ",
              n, (unsigned long long)total);
    sb_json_str(sb, fmt, strlen(fmt));
    sb_puts(sb, ", \"crc32\": ");
    *crc_at = sb->len;
    sb_printf(sb, "%*u}", CRC_DIGITS, crc);
}

/* ---- CRC of what was written ---- */

/* CRC-32 of output bytes [at, at + len): those already flushed are read back from the
 * temporary file, the rest are still in the write buffer. */
static uint32_t crc_written(out_file *f, uint64_t at, uint64_t len, ckpt_err *err) {
    uLong crc = crc32(0L, Z_NULL, 0);
    uint64_t flushed = f->written - f->buf_len, end = at + len;
    unsigned char *buf = at < flushed ? malloc(READ_BACK) : NULL;
    if (at < flushed && !buf) {
        f->failed = ckpt_fail(err, -ENOMEM, "out of memory");
        return 0;
    }
    while (at < flushed && at < end && !f->failed) {
        uint64_t stop = end < flushed ? end : flushed;
        size_t n = stop - at < READ_BACK ? (size_t)(stop - at) : READ_BACK;
        ssize_t r = pread(f->fd, buf, n, (off_t)at);
        if (r <= 0) {
            f->failed = ckpt_fail(err, -EIO,
                                  "%s: reading back the data section at %llu for its "
                                  "CRC-32 failed",
                                  f->final_path, (unsigned long long)at);
            break;
        }
        crc = crc32(crc, buf, (uInt)r);
        at += (uint64_t)r;
    }
    free(buf);
    while (at < end && !f->failed) { /* the rest is in the buffer; uInt may be 32 bits */
        size_t n = end - at < (1u << 30) ? (size_t)(end - at) : (1u << 30);
        crc = crc32(crc, f->buf + (at - flushed), (uInt)n);
        at += n;
    }
    return (uint32_t)crc;
}

/* CRC-32 of the data section the tensors sel[0..n) make, read from their sources. */
static int crc_of_sources(const ckpt_catalog *cat, const size_t *sel, size_t n, uint32_t *out,
                          ckpt_err *err) {
    static const unsigned char zeros[DATA_ALIGN];
    unsigned char *buf = malloc(READ_BACK);
    if (!buf) return ckpt_fail(err, -ENOMEM, "out of memory");
    uLong crc = crc32(0L, Z_NULL, 0);
    uint64_t at = 0;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const ckpt_tensor *t = &cat->tensors[sel[i]];
        crc = crc32(crc, zeros, (uInt)(align_up(at) - at));
        at = align_up(at);
        for (uint64_t off = 0; off < t->nbytes && !rc; off += READ_BACK) {
            size_t len = t->nbytes - off < READ_BACK ? (size_t)(t->nbytes - off) : READ_BACK;
            if (!(rc = out_tensor_read(cat, t, off, buf, len, err)))
                crc = crc32(crc, buf, (uInt)len);
        }
        at += t->nbytes;
    }
    free(buf);
    *out = (uint32_t)crc;
    return rc;
}

/* Overwrites bytes already written at `at`: in the file if flushed, else in the buffer. */
static void patch(out_file *f, uint64_t at, const void *p, size_t n, ckpt_err *err) {
    uint64_t flushed = f->written - f->buf_len;
    const unsigned char *src = p;
    for (size_t i = 0; i < n && !f->failed; i++) {
        if (at + i >= flushed) {
            f->buf[at + i - flushed] = src[i];
        } else if (pwrite(f->fd, src + i, 1, (off_t)(at + i)) != 1) {
            f->failed =
                ckpt_fail(err, -EIO, "%s: filling in the header's crc32 failed", f->final_path);
        }
    }
}

/* ---- the file ---- */

static int write_lwt(out_file *f, const ckpt_catalog *cat, ckpt_err *err) {
    size_t *sel = NULL, n = 0;
    int rc = writer_select(f, cat, check_tensor, "an LWATCHV1 file", &sel, &n, err);
    if (rc) return rc;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) total += cat->tensors[sel[i]].nbytes;
    strbuf header;
    sb_init(&header);
    uint32_t crc = 0;
    bool crc_first = out_compressed(f);
    if (crc_first && (rc = crc_of_sources(cat, sel, n, &crc, err))) goto out;
    size_t crc_at;
    build_header(&header, cat, n, total, crc, &crc_at);
    if (header.failed || header.len > UINT32_MAX) {
        rc = header.failed
                 ? ckpt_fail(err, -ENOMEM, "out of memory")
                 : ckpt_fail(err, -EINVAL, "%s: the header JSON is over 4 GiB", f->final_path);
        goto out;
    }
    unsigned char b[ENTRY_SIZE];
    out_bytes(f, "LWATCHV1", 8);
    put_le32(b, (uint32_t)header.len);
    out_bytes(f, b, 4);
    out_bytes(f, header.data, header.len);
    uint64_t offset = 0, data_len = 0;
    for (size_t i = 0; i < n; i++) {
        const ckpt_tensor *t = &cat->tensors[sel[i]];
        memset(b, 0, sizeof b);
        memcpy(b, t->name, t->name_len);
        put_le32(b + NAME_FIELD, t->ndim);
        for (uint32_t d = 0; d < t->ndim; d++) put_le64(b + 136 + 8 * d, t->shape[d]);
        offset = align_up(offset);
        put_le64(b + 200, offset);
        put_le64(b + 208, t->nbytes);
        out_bytes(f, b, ENTRY_SIZE);
        offset += t->nbytes;
        data_len = offset;
    }
    uint64_t data_at = align_up(f->written);
    out_zeros(f, data_at - f->written);
    for (size_t i = 0; i < n && !f->failed; i++) {
        out_zeros(f, align_up(f->written - data_at) - (f->written - data_at));
        out_tensor(f, cat, &cat->tensors[sel[i]]);
    }
    if (!f->failed) {
        if (!crc_first) crc = crc_written(f, data_at, data_len, err);
        put_le32(b, crc);
        out_bytes(f, b, 4);
        char digits[CRC_DIGITS + 1];
        snprintf(digits, sizeof digits, "%*u", CRC_DIGITS, crc);
        if (!crc_first) patch(f, 12 + crc_at, digits, CRC_DIGITS, err);
    }
    rc = f->failed;
out:
    sb_free(&header);
    free(sel);
    return rc;
}

const ckpt_writer writer_lwt = {.suffix = ".lwt", .write = write_lwt, .zst_ok = true};
