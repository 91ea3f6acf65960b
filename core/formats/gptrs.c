/* gpt-rs (github.com/Lallapallooza/gpt.rs): GPTRSCHK checkpoints and GPTRSTEN tensor archives.
 * All integers little-endian, no padding anywhere.
 *
 *   v2 checkpoint: "GPTRSCHK", version u32 = 2, config_len u32, config JSON, index_len u32,
 *                  index, payloads
 *   v2 archive:    "GPTRSTEN", version u32 = 2, index_len u32, index, payloads
 *   index:         tensor_count u32, then per tensor: name_len u32, name, stored_base_id u128
 *                  (checkpoints only), rank u32, dims u64 x rank, dtype_tag u32 (0 F32, 1 F16,
 *                  2 BF16, 3 I32), reserved u8 (once requires_grad), offset u64 (absolute),
 *                  byte_len u64
 *   v1 (the first layout, read too): "GPTRSCHK", version 1, config_len, config, tensor_count,
 *                  or "GPTRSTEN", version 1, tensor_count; then per tensor inline: name_len,
 *                  name, rank, dims, dtype_tag, requires_grad u8, byte_len u64, payload.
 *
 * Checks follow the gpt-rs reader at HEAD: version, exact reads of config and index, a cursor
 * that may not run past index_len, valid UTF-8 names, dtype tags 0..3, the config parses as a
 * ModelConfig (a "kind" string; for "gpt" the seven GptConfig fields), checkpoint names are
 * ASCII and a non-zero stored_base_id equals BLAKE3(name)[0..16]. Where ckptfs must go further
 * because it serves bytes rather than building a model:
 *   - byte_len must equal numel x element size for every dtype (gpt-rs checks it only when it
 *     reads F32/I32, and cannot read F16/BF16 at all; ckptfs shows them as F16/BF16 files);
 *   - each payload must lie inside the file (gpt-rs finds out when it reads);
 *   - rank is at most 32 and a name at most 65535 bytes (limits of ckptfs, not of gpt-rs).
 * What gpt-rs accepts, ckptfs accepts, with a warning in summary.json: bytes after the last
 * index entry, payloads that overlap each other or the header, and a duplicate name (the later
 * entry wins, as in gpt-rs's by-name lookup). A config without "kind" is read as the legacy
 * untagged GPT config (gpt-rs HEAD refuses it; the notes recommend accepting it); an unknown
 * kind is a warning, because the tensors do not depend on it. */
#include "formats.h"
#include "../util/le.h"

#include "../util/blake3.h"
#include "../util/hashmap.h"
#include "../util/json.h"
#include "../util/strbuf.h"
#include "../util/utf8.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    NAME_LIMIT = 65535,
    BASE_ID_LEN = 16,
    /* Smallest entries, for capping tensor_count by the bytes that could hold them. */
    MIN_ENTRY_CHK = 4 + BASE_ID_LEN + 4 + 4 + 1 + 8 + 8,
    MIN_ENTRY_TEN = 4 + 4 + 4 + 1 + 8 + 8,
    MIN_ENTRY_V1 = 4 + 4 + 4 + 1 + 8,
};

static const struct {
    ckpt_dtype dtype;
    const char *name;
} DTYPE_TAGS[] = {{CKPT_F32, "F32"}, {CKPT_F16, "F16"}, {CKPT_BF16, "BF16"}, {CKPT_I32, "I32"}};

static bool probe(const unsigned char *head, size_t n, uint64_t file_size) {
    (void)file_size;
    return n >= 8 && (memcmp(head, "GPTRSCHK", 8) == 0 || memcmp(head, "GPTRSTEN", 8) == 0);
}

/* Reads fields in order from a region of the file: the index held in memory (v2), or the file
 * itself through ckpt_source_read (v1, whose entries are interleaved with their payloads). */
typedef struct cursor {
    const ckpt_catalog *cat;
    uint32_t source;
    const unsigned char *mem; /* the region's bytes, or NULL to read the file */
    uint64_t start, pos, end; /* file offsets */
    const char *region;       /* "index" or "file", for messages */
    ckpt_err *err;
    int64_t entry; /* entry being read, named in messages as "tensor N field"; -1 outside */
} cursor;

/* Fails unless n more bytes remain in the region; what names the field for the message. */
static int need(const cursor *c, uint64_t n, const char *what) {
    if (n <= c->end - c->pos) return 0;
    char label[64];
    if (c->entry >= 0) snprintf(label, sizeof label, "tensor %lld %s", (long long)c->entry, what);
    return ckpt_fail(
        c->err, -EINVAL, "%s: %s at offset %llu needs %llu bytes but the %s ends at offset %llu",
        c->cat->sources[c->source].path, c->entry >= 0 ? label : what, (unsigned long long)c->pos,
        (unsigned long long)n, c->region, (unsigned long long)c->end);
}

/* Moves past n bytes; *p points at them: into mem, or into buf (at least n bytes) when reading
 * the file. */
static int take(cursor *c, uint64_t n, const unsigned char **p, unsigned char *buf,
                const char *what) {
    int rc = need(c, n, what);
    if (rc) return rc;
    *p = c->mem ? c->mem + (c->pos - c->start) : buf;
    if (!c->mem && n &&
        (rc = ckpt_source_read(c->cat, c->source, c->pos, buf, (size_t)n, what, c->err)))
        return rc;
    c->pos += n;
    return 0;
}

static int take_u32(cursor *c, uint32_t *v, const char *what) {
    unsigned char buf[4];
    const unsigned char *p;
    int rc = take(c, 4, &p, buf, what);
    if (!rc) *v = le32(p);
    return rc;
}

static int take_u64(cursor *c, uint64_t *v, const char *what) {
    unsigned char buf[8];
    const unsigned char *p;
    int rc = take(c, 8, &p, buf, what);
    if (!rc) *v = le64(p);
    return rc;
}

/* One index entry, decoded and checked. */
typedef struct entry {
    const char *name; /* into the index, or into the local arena (v1) */
    uint32_t name_len;
    uint32_t rank;
    uint64_t *dims;
    uint32_t dtype_tag;
    uint8_t reserved;
    bool stored_id; /* a non-zero stored_base_id */
    uint8_t base_id[BASE_ID_LEN];
    uint64_t offset, byte_len;
    uint64_t entry_at, name_at, dims_at, offset_at, len_at; /* file offsets, for messages */
} entry;

typedef struct reader {
    ckpt_catalog *cat;
    uint32_t source;
    const ckpt_source *src;
    bool checkpoint; /* GPTRSCHK, else GPTRSTEN */
    uint32_t version;
    arena mem; /* names (v1) and dims of every entry */
    entry *entries;
    uint32_t count;
    uint64_t index_end; /* v2: where the header and index end */
    ckpt_err *err;
} reader;

static void put_shape(char *buf, size_t cap, const uint64_t *dims, uint32_t rank) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (uint32_t i = 0; i < rank && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%llu", i ? ", " : "",
                              (unsigned long long)dims[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

static void put_hex(char *out, const uint8_t *b, size_t n) {
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hex[b[i] >> 4];
        out[2 * i + 1] = hex[b[i] & 15];
    }
    out[2 * n] = 0;
}

static bool all_zero(const uint8_t *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (b[i]) return false;
    return true;
}

/* The name: valid UTF-8 always, ASCII in checkpoints (its BaseParamId is defined on ASCII). */
static int check_name(reader *r, const entry *e) {
    const unsigned char *p = (const unsigned char *)e->name;
    for (size_t i = 0; i < e->name_len;) {
        size_t k = utf8_seq_len(p + i, e->name_len - i);
        if (k == 0)
            return ckpt_fail(r->err, -EINVAL,
                             "%s: tensor name at offset %llu is not valid UTF-8 (byte 0x%02x at "
                             "offset %llu)",
                             r->src->path, (unsigned long long)e->name_at, p[i],
                             (unsigned long long)(e->name_at + i));
        if (r->checkpoint && k > 1)
            return ckpt_fail(r->err, -EINVAL,
                             "%s: tensor name \"%.*s\" at offset %llu is not ASCII (byte 0x%02x at "
                             "offset %llu); gpt-rs derives base ids from ASCII names only",
                             r->src->path, SHOWN_NAME(e->name, e->name_len),
                             (unsigned long long)e->name_at, p[i],
                             (unsigned long long)(e->name_at + i));
        i += k;
    }
    return 0;
}

/* Everything after the name that does not depend on where the entry came from. */
static int check_entry(reader *r, entry *e) {
    const char *path = r->src->path;
    const char *shown = ckpt_shown(e->name, e->name_len);
    int n = -1; /* "%.*s" prints all of shown */
    if (e->dtype_tag >= sizeof DTYPE_TAGS / sizeof *DTYPE_TAGS)
        return ckpt_fail(r->err, -EINVAL,
                         "%s: tensor \"%.*s\": dtype_tag %u at offset %llu is not one of 0 (F32), "
                         "1 (F16), 2 (BF16), 3 (I32)",
                         path, n, shown, e->dtype_tag,
                         (unsigned long long)(e->dims_at + 8ull * e->rank));
    ckpt_dtype dt = DTYPE_TAGS[e->dtype_tag].dtype;
    uint64_t numel, nbytes;
    char shape[160];
    bool sized = catalog_shape_nbytes(e->dims, e->rank, dt, &numel, &nbytes);
    if (!sized || e->byte_len != nbytes) put_shape(shape, sizeof shape, e->dims, e->rank);
    if (!sized)
        return ckpt_fail(r->err, -EINVAL,
                         "%s: tensor \"%.*s\": dims %s at offset %llu: the byte size of the shape "
                         "overflows 64 bits",
                         path, n, shown, shape, (unsigned long long)e->dims_at);
    if (e->byte_len != nbytes)
        return ckpt_fail(r->err, -EINVAL,
                         "%s: tensor \"%.*s\": byte_len %llu at offset %llu does not match dims %s "
                         "of %s (%llu bytes)",
                         path, n, shown, (unsigned long long)e->byte_len,
                         (unsigned long long)(e->offset_at + 8), shape,
                         DTYPE_TAGS[e->dtype_tag].name, (unsigned long long)nbytes);
    if (r->version == 1 && e->byte_len > r->src->size - e->offset)
        return ckpt_fail(r->err, -EINVAL,
                         "%s: tensor \"%.*s\": byte_len %llu at offset %llu runs past the end of "
                         "the file (size %llu)",
                         path, n, shown, (unsigned long long)e->byte_len,
                         (unsigned long long)e->len_at, (unsigned long long)r->src->size);
    if (e->offset > r->src->size || e->byte_len > r->src->size - e->offset)
        return ckpt_fail(r->err, -EINVAL,
                         "%s: tensor \"%.*s\": offset %llu at offset %llu with byte_len %llu runs "
                         "past the end of the file (size %llu)",
                         path, n, shown, (unsigned long long)e->offset,
                         (unsigned long long)e->offset_at, (unsigned long long)e->byte_len,
                         (unsigned long long)r->src->size);
    if (r->checkpoint) {
        uint8_t digest[BLAKE3_OUT_LEN];
        blake3_hash(e->name, e->name_len, digest);
        if (e->stored_id && memcmp(digest, e->base_id, BASE_ID_LEN) != 0) {
            char stored[2 * BASE_ID_LEN + 1], want[2 * BASE_ID_LEN + 1];
            put_hex(stored, e->base_id, BASE_ID_LEN);
            put_hex(want, digest, BASE_ID_LEN);
            return ckpt_fail(r->err, -EINVAL,
                             "%s: tensor \"%.*s\": stored_base_id %s at offset %llu does not "
                             "match BLAKE3 of the name (%s): base_id mismatch",
                             path, n, shown, stored, (unsigned long long)(e->name_at + e->name_len),
                             want);
        }
        memcpy(e->base_id, digest, BASE_ID_LEN);
    }
    return 0;
}

/* Reads the entry at the cursor. v1 entries have no base id and no offset: the payload
 * follows, and the cursor skips it. */
static int read_entry(reader *r, cursor *c, uint32_t i, entry *e) {
    unsigned char small[BASE_ID_LEN];
    const unsigned char *p;
    int rc;
    memset(e, 0, sizeof *e);
    e->entry_at = c->pos;
    c->entry = i;
    if ((rc = take_u32(c, &e->name_len, "name_len"))) return rc;
    if ((rc = need(c, e->name_len, "name"))) return rc;
    if (e->name_len > NAME_LIMIT)
        return ckpt_fail(r->err, -EINVAL,
                         "%s: tensor %u name_len %u at offset %llu exceeds ckptfs's limit of %d "
                         "bytes",
                         r->src->path, i, e->name_len, (unsigned long long)e->entry_at, NAME_LIMIT);
    e->name_at = c->pos;
    unsigned char *namebuf = NULL;
    if (!c->mem) {
        namebuf = arena_alloc(&r->mem, e->name_len + 1u);
        if (!namebuf) return ckpt_fail(r->err, -ENOMEM, "out of memory");
    }
    if ((rc = take(c, e->name_len, &p, namebuf, "name"))) return rc;
    e->name = (const char *)p;
    if ((rc = check_name(r, e))) return rc;
    if (r->checkpoint && r->version == 2) {
        if ((rc = take(c, BASE_ID_LEN, &p, small, "stored_base_id"))) return rc;
        memcpy(e->base_id, p, BASE_ID_LEN);
        e->stored_id = !all_zero(e->base_id, BASE_ID_LEN);
    }
    uint64_t rank_at = c->pos;
    if ((rc = take_u32(c, &e->rank, "rank"))) return rc;
    e->dims_at = c->pos;
    if (8ull * e->rank > c->end - c->pos)
        return ckpt_fail(r->err, -EINVAL,
                         "%s: tensor \"%.*s\": rank %u at offset %llu needs %llu bytes of dims but "
                         "the %s ends at offset %llu",
                         r->src->path, SHOWN_NAME(e->name, e->name_len), e->rank,
                         (unsigned long long)rank_at, 8ull * e->rank, c->region,
                         (unsigned long long)c->end);
    if (e->rank > CKPT_MAX_DIMS)
        return ckpt_fail(r->err, -EINVAL,
                         "%s: tensor \"%.*s\": rank %u at offset %llu exceeds the %d dims ckptfs "
                         "supports",
                         r->src->path, SHOWN_NAME(e->name, e->name_len), e->rank,
                         (unsigned long long)rank_at, CKPT_MAX_DIMS);
    e->dims = arena_array(&r->mem, e->rank ? e->rank : 1, sizeof *e->dims);
    if (!e->dims) return ckpt_fail(r->err, -ENOMEM, "out of memory");
    for (uint32_t d = 0; d < e->rank; d++) {
        if ((rc = take_u64(c, &e->dims[d], "dims"))) return rc;
    }
    if ((rc = take_u32(c, &e->dtype_tag, "dtype_tag"))) return rc;
    if ((rc = take(c, 1, &p, small, r->version == 2 ? "reserved" : "requires_grad"))) return rc;
    e->reserved = p[0];
    if (r->version == 2) {
        e->offset_at = c->pos;
        e->len_at = c->pos + 8;
        if ((rc = take_u64(c, &e->offset, "offset"))) return rc;
        if ((rc = take_u64(c, &e->byte_len, "byte_len"))) return rc;
    } else {
        if ((rc = take_u64(c, &e->byte_len, "byte_len"))) return rc;
        e->offset = c->pos; /* v1 has no offset field: the payload follows */
        e->len_at = c->pos - 8;
        /* The dtype and size checks come first so the message says why, not just "too long". */
        if ((rc = check_entry(r, e))) return rc;
        /* check_entry proved the payload lies inside the file, which is this region. */
        c->pos += e->byte_len;
        return 0;
    }
    return check_entry(r, e);
}

/* tensor_count, capped by what the remaining bytes could hold. */
static int read_count(reader *r, cursor *c, uint32_t min_entry) {
    uint64_t at = c->pos;
    int rc = take_u32(c, &r->count, "tensor_count");
    if (rc) return rc;
    uint64_t room = c->end - c->pos;
    if (r->count > room / min_entry)
        return ckpt_fail(r->err, -EINVAL,
                         "%s: tensor_count %u at offset %llu needs at least %llu bytes but the %s "
                         "has %llu after it",
                         r->src->path, r->count, (unsigned long long)at,
                         (unsigned long long)r->count * min_entry, c->region,
                         (unsigned long long)room);
    r->entries = calloc(r->count ? r->count : 1, sizeof *r->entries);
    return r->entries ? 0 : ckpt_fail(r->err, -ENOMEM, "out of memory");
}

static bool is_int(const json_value *v) {
    uint64_t x;
    return v && json_as_u64(v, &x);
}

/* The seven GptConfig fields, all required (gpt-rs ignores unknown keys). */
static int check_gpt_config(reader *r, const json_value *cfg, uint64_t base, const char *where) {
    static const char *const counts[] = {"vocab_size", "context_length", "embed_dim",
                                         "num_layers", "num_heads",      "mlp_ratio"};
    if (cfg->type != JSON_OBJECT)
        return ckpt_fail(
            r->err, -EINVAL, "%s: config_json %s at offset %llu is a %s, not a GptConfig object",
            r->src->path, where, (unsigned long long)(base + cfg->pos), json_type_name(cfg->type));
    for (size_t i = 0; i < sizeof counts / sizeof *counts; i++) {
        const json_value *v = json_member(cfg, counts[i]);
        if (!is_int(v))
            return ckpt_fail(r->err, -EINVAL,
                             "%s: config_json %s at offset %llu: \"%s\" is %s, not a non-negative "
                             "integer (invalid GptConfig)",
                             r->src->path, where,
                             (unsigned long long)(base + (v ? v->pos : cfg->pos)), counts[i],
                             v ? json_type_name(v->type) : "missing");
    }
    const json_value *dropout = json_member(cfg, "dropout");
    if (!dropout || dropout->type != JSON_NUMBER)
        return ckpt_fail(r->err, -EINVAL,
                         "%s: config_json %s at offset %llu: \"dropout\" is %s, not a number "
                         "(invalid GptConfig)",
                         r->src->path, where,
                         (unsigned long long)(base + (dropout ? dropout->pos : cfg->pos)),
                         dropout ? json_type_name(dropout->type) : "missing");
    return 0;
}

/* config_json must be a ModelConfig: {"kind": string, "config": any, "runtime"?: object|null}.
 * *legacy is set for an untagged GPT config. */
static int check_config(reader *r, const json_value *root, uint64_t base, bool *legacy) {
    const char *path = r->src->path;
    *legacy = false;
    if (root->type != JSON_OBJECT)
        return ckpt_fail(r->err, -EINVAL,
                         "%s: config_json at offset %llu is a%s %s, not an object (invalid "
                         "ModelConfig)",
                         path, (unsigned long long)(base + root->pos),
                         root->type == JSON_ARRAY ? "n" : "", json_type_name(root->type));
    const json_value *kind = json_member(root, "kind");
    if (!kind) {
        int rc = check_gpt_config(r, root, base, "without \"kind\" (legacy untagged GPT config)");
        if (rc) return rc;
        *legacy = true;
        if (r->version == 2) /* in v1 untagged is the only form */
            catalog_warn(r->cat,
                         "%s: config_json has no \"kind\": read as a legacy untagged GPT config",
                         r->src->relpath);
        return 0;
    }
    if (kind->type != JSON_STRING)
        return ckpt_fail(r->err, -EINVAL,
                         "%s: config_json \"kind\" at offset %llu is a %s, not a string (invalid "
                         "ModelConfig)",
                         path, (unsigned long long)(base + kind->pos), json_type_name(kind->type));
    const json_value *runtime = json_member(root, "runtime");
    if (runtime && runtime->type != JSON_OBJECT && runtime->type != JSON_NULL)
        return ckpt_fail(r->err, -EINVAL,
                         "%s: config_json \"runtime\" at offset %llu is a %s, not an object or "
                         "null (invalid ModelConfig)",
                         path, (unsigned long long)(base + runtime->pos),
                         json_type_name(runtime->type));
    const json_value *cfg = json_member(root, "config");
    if (json_str_eq(kind, "gpt"))
        return cfg ? check_gpt_config(r, cfg, base, "\"config\"")
                   : ckpt_fail(r->err, -EINVAL,
                               "%s: config_json at offset %llu has kind \"gpt\" but no \"config\" "
                               "(invalid GptConfig)",
                               path, (unsigned long long)(base + root->pos));
    if (!json_str_eq(kind, "ministral") && !json_str_eq(kind, "resnet34") &&
        !json_str_eq(kind, "mobilenet_v2"))
        catalog_warn(r->cat, "%s: config_json kind \"%.*s\" is not one gpt-rs knows",
                     r->src->relpath, SHOWN_NAME(kind->str, kind->len));
    return 0;
}

/* config_len and config_json (checkpoints only); the config goes to metadata.json verbatim. */
static int read_config(reader *r, cursor *c, strbuf *doc) {
    uint32_t len;
    int rc = take_u32(c, &len, "config_len");
    if (rc) return rc;
    uint64_t at = c->pos;
    if (len > c->end - c->pos)
        return ckpt_fail(r->err, -EINVAL,
                         "%s: config_len %u at offset %llu runs past the end of the file (size "
                         "%llu)",
                         r->src->path, len, (unsigned long long)(at - 4),
                         (unsigned long long)r->src->size);
    char *text = malloc(len ? len : 1);
    if (!text) return ckpt_fail(r->err, -ENOMEM, "out of memory");
    rc = ckpt_source_read(r->cat, r->source, at, text, len, "config_json", r->err);
    c->pos += len;
    json_doc jd;
    json_error jerr;
    if (!rc && (rc = json_parse(&jd, text, len, &jerr)))
        rc = ckpt_fail(r->err, rc, "%s: config_json: %s (byte offset %llu)", r->src->path, jerr.msg,
                       (unsigned long long)(at + jerr.pos));
    else if (!rc) {
        bool legacy;
        rc = check_config(r, jd.root, at, &legacy);
        const json_value *kind = json_member(jd.root, "kind");
        if (!rc) {
            sb_puts(doc, ", \"kind\": ");
            if (kind)
                sb_json_str(doc, kind->str, kind->len);
            else
                sb_puts(doc, "\"gpt\", \"legacy_config\": true");
            sb_puts(doc, ", \"config\": ");
            sb_put(doc, text, len);
        }
        json_doc_free(&jd);
    }
    free(text);
    return rc;
}

static int add_tensors(reader *r) {
    hashmap last; /* name -> index of its last entry: gpt-rs's by-name lookup finds that one */
    if (!hm_init(&last, r->count)) return ckpt_fail(r->err, -ENOMEM, "out of memory");
    int rc = 0;
    for (uint32_t i = 0; i < r->count && !rc; i++) {
        bool added;
        hm_entry *h = hm_put(&last, r->entries[i].name, r->entries[i].name_len, i, &added);
        if (!h)
            rc = ckpt_fail(r->err, -ENOMEM, "out of memory");
        else if (!added) {
            catalog_warn(r->cat,
                         "%s: tensor \"%.*s\" at offset %llu repeats the name of the entry at "
                         "offset %llu; the later entry is used, as in gpt-rs",
                         r->src->relpath, SHOWN_NAME(r->entries[i].name, r->entries[i].name_len),
                         (unsigned long long)r->entries[i].entry_at,
                         (unsigned long long)r->entries[h->value].entry_at);
            h->value = i;
        }
    }
    for (uint32_t i = 0; i < r->count && !rc; i++) {
        const entry *e = &r->entries[i];
        if (hm_get(&last, e->name, e->name_len)->value != i) continue;
        if (r->version == 2 && e->byte_len && e->offset < r->index_end)
            catalog_warn(r->cat,
                         "%s: tensor \"%.*s\": payload at offset %llu overlaps the header and "
                         "index (they end at offset %llu)",
                         r->src->relpath, SHOWN_NAME(e->name, e->name_len),
                         (unsigned long long)e->offset, (unsigned long long)r->index_end);
        size_t idx;
        rc = catalog_add_tensor(r->cat, e->name, e->name_len, DTYPE_TAGS[e->dtype_tag].dtype,
                                e->rank, e->dims, &idx, r->err);
        if (!rc)
            rc = catalog_add_piece(r->cat, idx, r->source, e->offset, NULL, NULL, NULL, r->err);
        if (rc) break;
        char extra[192];
        int n = r->version == 2
                    ? snprintf(extra, sizeof extra, "\"dtype_tag\": %u, \"reserved\": %u",
                               e->dtype_tag, e->reserved)
                    : snprintf(extra, sizeof extra, "\"dtype_tag\": %u, \"requires_grad\": %s",
                               e->dtype_tag, e->reserved ? "true" : "false");
        if (r->checkpoint) {
            char hex[2 * BASE_ID_LEN + 1];
            put_hex(hex, e->base_id, BASE_ID_LEN);
            snprintf(extra + n, sizeof extra - (size_t)n,
                     ", \"base_id\": \"%s\", \"base_id_stored\": %s", hex,
                     e->stored_id ? "true" : "false");
        }
        rc = catalog_set_extra(r->cat, idx, extra, r->err);
    }
    hm_free(&last);
    return rc;
}

static int load(ckpt_catalog *cat, uint32_t source, ckpt_err *err) {
    reader r = {.cat = cat, .source = source, .src = &cat->sources[source], .err = err};
    arena_init(&r.mem);
    cursor file = {cat, source, NULL, 0, 8, r.src->size, "file", err, -1};
    unsigned char *index = NULL;
    strbuf doc;
    sb_init(&doc);
    unsigned char magic[8];
    int rc = ckpt_source_read(cat, source, 0, magic, 8, "magic", err);
    if (rc) goto out;
    r.checkpoint = memcmp(magic, "GPTRSCHK", 8) == 0;
    const char *container = r.checkpoint ? "GPTRSCHK" : "GPTRSTEN";
    if ((rc = take_u32(&file, &r.version, "version"))) goto out;
    if (r.version != 1 && r.version != 2) {
        rc = ckpt_fail(err, -EINVAL,
                       "%s: %s version %u at offset 8 is not supported (gpt-rs writes 2; 1 is the "
                       "original layout)",
                       r.src->path, container, r.version);
        goto out;
    }
    sb_printf(&doc, "{\"container\": \"%s\", \"version\": %u", container, r.version);
    if (r.checkpoint && (rc = read_config(&r, &file, &doc))) goto out;

    cursor c = file; /* v1: the entries follow in the file */
    if (r.version == 2) {
        uint32_t index_len;
        if ((rc = take_u32(&file, &index_len, "index_len"))) goto out;
        if (index_len > file.end - file.pos) {
            rc = ckpt_fail(err, -EINVAL,
                           "%s: index_len %u at offset %llu runs past the end of the file (size "
                           "%llu)",
                           r.src->path, index_len, (unsigned long long)(file.pos - 4),
                           (unsigned long long)r.src->size);
            goto out;
        }
        index = malloc(index_len ? index_len : 1);
        if (!index) {
            rc = ckpt_fail(err, -ENOMEM, "out of memory");
            goto out;
        }
        if ((rc = ckpt_source_read(cat, source, file.pos, index, index_len, "index", err)))
            goto out;
        c = (cursor){cat,     source, index, file.pos, file.pos, file.pos + index_len,
                     "index", err,    -1};
        r.index_end = c.end;
    }
    uint32_t min_entry = r.version == 1 ? MIN_ENTRY_V1
                         : r.checkpoint ? MIN_ENTRY_CHK
                                        : MIN_ENTRY_TEN;
    if ((rc = read_count(&r, &c, min_entry))) goto out;
    for (uint32_t i = 0; i < r.count; i++)
        if ((rc = read_entry(&r, &c, i, &r.entries[i]))) goto out;
    if (c.pos != c.end)
        catalog_warn(cat, "%s: %llu bytes after the last %s entry at offset %llu are ignored",
                     r.src->relpath, (unsigned long long)(c.end - c.pos),
                     r.version == 2 ? "index" : "tensor", (unsigned long long)c.pos);
    sb_printf(&doc, ", \"tensor_count\": %u}", r.count);
    if (doc.failed) {
        rc = ckpt_fail(err, -ENOMEM, "out of memory");
        goto out;
    }
    if ((rc = catalog_add_doc(cat, "gpt-rs", doc.data, doc.len, err))) goto out;
    rc = add_tensors(&r);
out:
    sb_free(&doc);
    free(index);
    free(r.entries);
    arena_free(&r.mem);
    return rc;
}

const ckpt_format format_gptrs = {
    .name = "gpt-rs",
    .label = "gpt-rs",
    .probe = probe,
    .load = load,
    .integrity = "structure, and the BLAKE3 base id of every name",
};
