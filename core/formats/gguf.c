/* gguf: llama.cpp's model format, versions 2 and 3, little-endian.
 *
 * Layout: "GGUF", u32 version, u64 tensor_count, u64 kv_count, the KVs (key string, u32 value
 * type, value), the tensor infos (name string, u32 n_dims, n_dims x u64 ne, u32 ggml type, u64
 * offset), zero padding to the alignment, then the data section. A string is a u64 length and
 * its bytes. ne[0] varies fastest, so the row-major shape is ne reversed.
 *
 * Decisions where the spec, ggml and gguf-py differ or are silent:
 * - KVs go to metadata.json under "gguf", one object in file order. Floats print with the fewest
 *   digits that read back to the same float32/float64; NaN and the infinities, which JSON lacks,
 *   print as the strings "NaN", "Infinity" and "-Infinity" (Python's and JavaScript's spellings).
 *   A value that cannot be shown whole (a string over 1 MiB, or a value that would take the
 *   document past 64 MiB) becomes {"elided": true, "type": ..., "length" or "count": N}; GGUF has
 *   no object type, so such an object is never a real value. KVs after the 64 MiB mark are left
 *   out with a warning.
 * - Nested arrays (the spec allows them, ggml refuses them) are read and shown, 16 levels deep.
 * - Tensor data: ggml wants tensors packed in info order; gguf-py writes and reads any layout.
 *   Gaps and any order are accepted; overlapping tensors, which no writer produces, are refused.
 * - Names and keys up to 64 KiB (ggml: 63 bytes); up to 32 dims (ggml: 4); n_dims 0 is a scalar.
 * - A BOOL byte other than 0 or 1 reads as true, as in ggml.
 * - Split files (PREFIX-00001-of-00003.gguf with split.no, split.count, split.tensors.count):
 *   opening any part loads all parts from its directory; metadata.json shows the first part's
 *   KVs. */
#include "../io/place.h"
#include "formats.h"
#include "../util/grow.h"
#include "../util/le.h"

#include "../util/hashmap.h"
#include "../util/strbuf.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum {
    DEFAULT_ALIGNMENT = 32,
    NAME_LIMIT = 65536, /* tensor names and keys */
    NESTING_LIMIT = 16,
    READ_CHUNK = 1 << 20,
    STRING_SHOW_LIMIT = 1 << 20,
    DOC_LIMIT = 64 << 20,
    MIN_KV_BYTES = 8 + 4 + 1,       /* key length, value type, a 1-byte value */
    MIN_INFO_BYTES = 8 + 4 + 4 + 8, /* name length, n_dims, type, offset */
    SPLIT_LIMIT = 65535,            /* split.count is a UINT16 */
};

/* gguf_type: what a KV value is. */
enum {
    V_U8,
    V_I8,
    V_U16,
    V_I16,
    V_U32,
    V_I32,
    V_F32,
    V_BOOL,
    V_STRING,
    V_ARRAY,
    V_U64,
    V_I64,
    V_F64,
    V_COUNT
};

static const char *const value_type_name[V_COUNT] = {
    "UINT8", "INT8",   "UINT16", "INT16",  "UINT32", "INT32",   "FLOAT32",
    "BOOL",  "STRING", "ARRAY",  "UINT64", "INT64",  "FLOAT64",
};

/* Bytes of a fixed-size value; 0 for STRING and ARRAY. */
static const unsigned value_size[V_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

static bool is_integer_type(uint32_t t) {
    return t <= V_I32 || t == V_U64 || t == V_I64;
}

static bool is_signed_type(uint32_t t) {
    return t == V_I8 || t == V_I16 || t == V_I32 || t == V_I64;
}

/* The fewest bytes one value of type t can take: a string or array at least its length fields. */
static uint64_t min_value_bytes(uint32_t t) {
    return t == V_STRING ? 8 : t == V_ARRAY ? 12 : value_size[t];
}

/* ggml_type ids (ggml.h); ids whose types were removed from ggml have no size and are refused. */
typedef struct ggml_type {
    bool known;
    ckpt_dtype dtype;
    const char *removed;
} ggml_type;

#define KNOWN(id, dt) [id] = {true, dt, NULL}
#define GONE(id, nm) [id] = {false, CKPT_BOOL, nm}
static const ggml_type ggml_types[] = {
    KNOWN(0, CKPT_F32),      KNOWN(1, CKPT_F16),      KNOWN(2, CKPT_Q4_0),
    KNOWN(3, CKPT_Q4_1),     GONE(4, "Q4_2"),         GONE(5, "Q4_3"),
    KNOWN(6, CKPT_Q5_0),     KNOWN(7, CKPT_Q5_1),     KNOWN(8, CKPT_Q8_0),
    KNOWN(9, CKPT_Q8_1),     KNOWN(10, CKPT_Q2_K),    KNOWN(11, CKPT_Q3_K),
    KNOWN(12, CKPT_Q4_K),    KNOWN(13, CKPT_Q5_K),    KNOWN(14, CKPT_Q6_K),
    KNOWN(15, CKPT_Q8_K),    KNOWN(16, CKPT_IQ2_XXS), KNOWN(17, CKPT_IQ2_XS),
    KNOWN(18, CKPT_IQ3_XXS), KNOWN(19, CKPT_IQ1_S),   KNOWN(20, CKPT_IQ4_NL),
    KNOWN(21, CKPT_IQ3_S),   KNOWN(22, CKPT_IQ2_S),   KNOWN(23, CKPT_IQ4_XS),
    KNOWN(24, CKPT_I8),      KNOWN(25, CKPT_I16),     KNOWN(26, CKPT_I32),
    KNOWN(27, CKPT_I64),     KNOWN(28, CKPT_F64),     KNOWN(29, CKPT_IQ1_M),
    KNOWN(30, CKPT_BF16),    GONE(31, "Q4_0_4_4"),    GONE(32, "Q4_0_4_8"),
    GONE(33, "Q4_0_8_8"),    KNOWN(34, CKPT_TQ1_0),   KNOWN(35, CKPT_TQ2_0),
    GONE(36, "IQ4_NL_4_4"),  GONE(37, "IQ4_NL_4_8"),  GONE(38, "IQ4_NL_8_8"),
    KNOWN(39, CKPT_MXFP4),   KNOWN(40, CKPT_NVFP4),   KNOWN(41, CKPT_Q1_0),
    KNOWN(42, CKPT_Q2_0),
};
enum { GGML_TYPE_COUNT = sizeof ggml_types / sizeof *ggml_types };

static bool probe(const unsigned char *head, size_t n, uint64_t file_size) {
    (void)file_size;
    /* "FUGG" is what gguf-py writes for big-endian files: matched so load() can say so. */
    return n >= 4 && (memcmp(head, "GGUF", 4) == 0 || memcmp(head, "FUGG", 4) == 0);
}

/* ---- one file (a whole model, or one part of a split model) ---- */

typedef struct placed {
    size_t tensor; /* catalog index */
    const char *name;
    size_t name_len;
    uint64_t offset, offset_at, nbytes;
} placed;

typedef struct split_key {
    bool present;
    uint64_t value, at;
} split_key;

typedef struct loader {
    ckpt_catalog *cat;
    ckpt_err *err;
    arena mem;     /* keys and tensor names while loading */
    hashmap names; /* tensor names over all parts */
} loader;

typedef struct part {
    loader *ld;
    uint32_t source;
    const char *path;
    uint64_t size;
    /* buffered reader: [buf_off, buf_off + buf_len) of the file is in buf */
    uint64_t pos, buf_off;
    unsigned char *buf;
    size_t cap, buf_len;
    char ctx[400]; /* the item being read, prefixed to messages (an escaped name fits) */
    uint32_t version;
    uint64_t tensor_count, kv_count, alignment, data_offset;
    strbuf kv_json;
    uint64_t kv_hidden;
    split_key split_no, split_count, split_tensors;
    placed *placed;
    size_t nplaced, cap_placed;
} part;

static int bad(part *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(part *p, const char *fmt, ...) {
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ckpt_fail(p->ld->err, -EINVAL, "%s: %s%s%s", p->path, p->ctx, p->ctx[0] ? ": " : "",
                     msg);
}

#define ULL(x) ((unsigned long long)(x))

/* Makes the n bytes at pos available at cur(p). */
static int need(part *p, uint64_t n, const char *what) {
    if (p->pos > p->size || n > p->size - p->pos)
        return bad(p, "%s at offset %llu (%llu bytes) runs past the end of the file (size %llu)",
                   what, ULL(p->pos), ULL(n), ULL(p->size));
    if (p->pos >= p->buf_off && n <= p->buf_len && p->pos - p->buf_off <= p->buf_len - n) return 0;
    uint64_t len = n > READ_CHUNK ? n : READ_CHUNK;
    if (len > p->size - p->pos) len = p->size - p->pos;
    /* Never NULL, even for a zero-byte read at the end of the file: cur(p) is then valid. */
    if (len > p->cap || !p->buf) {
        unsigned char *b = realloc(p->buf, len ? len : 1);
        if (!b) return ckpt_fail(p->ld->err, -ENOMEM, "out of memory");
        p->buf = b;
        p->cap = len ? len : 1;
    }
    p->buf_len = 0;
    int rc = ckpt_source_read(p->ld->cat, p->source, p->pos, p->buf, len, what, p->ld->err);
    if (rc) return rc;
    p->buf_off = p->pos;
    p->buf_len = len;
    return 0;
}

static const unsigned char *cur(const part *p) {
    return p->buf + (p->pos - p->buf_off);
}

static int get_u32(part *p, const char *what, uint32_t *v) {
    int rc = need(p, 4, what);
    if (rc) return rc;
    *v = le32(cur(p));
    p->pos += 4;
    return 0;
}

static int get_u64(part *p, const char *what, uint64_t *v) {
    int rc = need(p, 8, what);
    if (rc) return rc;
    *v = le64(cur(p));
    p->pos += 8;
    return 0;
}

static int skip(part *p, uint64_t n, const char *what) {
    if (n > p->size - p->pos)
        return bad(p, "%s at offset %llu (%llu bytes) runs past the end of the file (size %llu)",
                   what, ULL(p->pos), ULL(n), ULL(p->size));
    p->pos += n;
    return 0;
}

/* Reads a string's u64 length and checks it against the rest of the file and `limit`; pos is
 * left at the string's bytes. */
static int get_len(part *p, const char *what, uint64_t limit, uint64_t *len) {
    char field[48];
    snprintf(field, sizeof field, "%s length", what);
    uint64_t at = p->pos;
    int rc = get_u64(p, field, len);
    if (rc) return rc;
    if (*len > p->size - p->pos)
        return bad(p, "%s %llu at offset %llu runs past the end of the file (size %llu)", field,
                   ULL(*len), ULL(at), ULL(p->size));
    if (*len > limit)
        return bad(p, "%s %llu at offset %llu exceeds the limit of %llu bytes", field, ULL(*len),
                   ULL(at), ULL(limit));
    return 0;
}

/* Reads a string into the loader's arena (NUL-terminated; the length is what counts). */
static int get_name(part *p, const char *what, char **out, uint64_t *len) {
    int rc = get_len(p, what, NAME_LIMIT, len);
    if (!rc) rc = need(p, *len, what);
    if (rc) return rc;
    *out = arena_memdup(&p->ld->mem, cur(p), *len);
    if (!*out) return ckpt_fail(p->ld->err, -ENOMEM, "out of memory");
    p->pos += *len;
    return 0;
}

/* ---- KV values as JSON ---- */

/* Integers without printf: tokenizer arrays hold 100k+ of them. */
static void put_u64(strbuf *sb, uint64_t v) {
    char tmp[20];
    int n = 0;
    do tmp[n++] = (char)('0' + v % 10);
    while (v /= 10);
    while (n) sb_putc(sb, tmp[--n]);
}

static void put_i64(strbuf *sb, int64_t v) {
    if (v < 0) sb_putc(sb, '-');
    put_u64(sb, v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v);
}

/* Whole numbers (common in vocabulary scores) print fast and exactly; true if v was one. */
static bool put_whole(strbuf *sb, double v, double limit) {
    if (!(fabs(v) < limit) || v != trunc(v)) return false;
    if (v == 0 && signbit(v)) sb_putc(sb, '-');
    put_i64(sb, (int64_t)v);
    sb_puts(sb, ".0");
    return true;
}

/* "%g" writes 1.0 as "1" and -0.0 as "-0", which JSON readers take for integers (losing the
 * sign of -0.0): a float KV always shows a fraction or an exponent. */
static void put_float_text(strbuf *sb, const char *text) {
    sb_puts(sb, text);
    if (!strpbrk(text, ".e")) sb_puts(sb, ".0");
}

/* Shortest of 6..9 significant digits that reads back to the same float32. */
static void put_f32(strbuf *sb, float v) {
    if (isnan(v) || isinf(v)) {
        sb_puts(sb, isnan(v) ? "\"NaN\"" : v < 0 ? "\"-Infinity\"" : "\"Infinity\"");
        return;
    }
    if (put_whole(sb, v, 16777216.0)) return;
    char buf[40];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)v);
        if (strtof(buf, NULL) == v) break;
    }
    put_float_text(sb, buf);
}

static void put_f64(strbuf *sb, double v) {
    if (isnan(v) || isinf(v)) {
        sb_puts(sb, isnan(v) ? "\"NaN\"" : v < 0 ? "\"-Infinity\"" : "\"Infinity\"");
        return;
    }
    if (put_whole(sb, v, 9007199254740992.0)) return;
    char buf[40];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    put_float_text(sb, buf);
}

static void put_scalar(strbuf *sb, uint32_t type, const unsigned char *b) {
    switch (type) {
    case V_U8:
        put_u64(sb, b[0]);
        break;
    case V_I8:
        put_i64(sb, (int8_t)b[0]);
        break;
    case V_U16:
        put_u64(sb, le16(b));
        break;
    case V_I16:
        put_i64(sb, (int16_t)le16(b));
        break;
    case V_U32:
        put_u64(sb, le32(b));
        break;
    case V_I32:
        put_i64(sb, (int32_t)le32(b));
        break;
    case V_U64:
        put_u64(sb, le64(b));
        break;
    case V_I64:
        put_i64(sb, (int64_t)le64(b));
        break;
    case V_BOOL:
        sb_puts(sb, b[0] ? "true" : "false");
        break;
    case V_F32: {
        uint32_t bits = le32(b);
        float f;
        memcpy(&f, &bits, sizeof f);
        put_f32(sb, f);
        break;
    }
    case V_F64: {
        uint64_t bits = le64(b);
        double d;
        memcpy(&d, &bits, sizeof d);
        put_f64(sb, d);
        break;
    }
    }
}

/* What the caller needs of a top-level value: integers for the keys we act on, and the length of
 * a string or array for an elided one. */
typedef struct value_info {
    uint64_t u;    /* integer value, zero-extended */
    bool negative; /* a signed integer below zero */
    uint64_t count;
    uint32_t elem;
} value_info;

/* Reads one value of `type` at pos. While *show holds it is appended to kv_json; it is cleared
 * (and the caller elides the value) when the value is too large to show. */
static int read_value(part *p, uint32_t type, unsigned depth, bool *show, value_info *out) {
    strbuf *sb = &p->kv_json;
    int rc;
    if (value_size[type]) {
        if ((rc = need(p, value_size[type], "value"))) return rc;
        const unsigned char *b = cur(p);
        if (out) {
            uint64_t u = 0;
            for (unsigned i = value_size[type]; i-- > 0;) u = u << 8 | b[i];
            out->u = u;
            out->negative = is_signed_type(type) && (b[value_size[type] - 1] & 0x80);
        }
        if (*show) put_scalar(sb, type, b);
        p->pos += value_size[type];
        return 0;
    }
    if (type == V_STRING) {
        uint64_t len;
        if ((rc = get_len(p, "string", UINT64_MAX, &len))) return rc;
        if (out) out->count = len;
        if (len > STRING_SHOW_LIMIT) *show = false;
        if (!*show) return skip(p, len, "string");
        if ((rc = need(p, len, "string"))) return rc;
        sb_json_str(sb, (const char *)cur(p), len);
        p->pos += len;
        return 0;
    }
    uint64_t at = p->pos;
    uint32_t elem;
    if ((rc = get_u32(p, "array element type", &elem))) return rc;
    if (elem >= V_COUNT)
        return bad(p, "array element type %u at offset %llu is not a GGUF value type (0-12)", elem,
                   ULL(at));
    if (elem == V_ARRAY && depth + 1 >= NESTING_LIMIT)
        return bad(p, "arrays at offset %llu are nested more than %d deep", ULL(at), NESTING_LIMIT);
    at = p->pos;
    uint64_t count;
    if ((rc = get_u64(p, "array length", &count))) return rc;
    uint64_t least = min_value_bytes(elem);
    if (count > (p->size - p->pos) / least)
        return bad(p,
                   "array length %llu at offset %llu needs at least %llu bytes per %s, more than "
                   "the %llu left before the end of the file",
                   ULL(count), ULL(at), ULL(least), value_type_name[elem], ULL(p->size - p->pos));
    if (out) {
        out->count = count;
        out->elem = elem;
    }
    if (*show) sb_putc(sb, '[');
    for (uint64_t i = 0; i < count; i++) {
        if (*show && sb->len > DOC_LIMIT) *show = false;
        if (!*show && value_size[elem])
            return skip(p, (count - i) * value_size[elem], "array elements");
        if (*show && i) sb_puts(sb, ", ");
        if ((rc = read_value(p, elem, depth + 1, show, NULL))) return rc;
    }
    if (*show) sb_putc(sb, ']');
    return 0;
}

static void put_elided(strbuf *sb, uint32_t type, const value_info *v) {
    sb_printf(sb, "{\"elided\": true, \"type\": \"%s\", ", value_type_name[type]);
    if (type == V_ARRAY)
        sb_printf(sb, "\"element_type\": \"%s\", \"count\": ", value_type_name[v->elem]);
    else
        sb_puts(sb, "\"length\": ");
    sb_u64(sb, v->count);
    sb_putc(sb, '}');
}

static bool key_is(const char *key, uint64_t len, const char *want) {
    return len == strlen(want) && memcmp(key, want, len) == 0;
}

/* general.alignment and the split.* keys change how the file is read. */
static int use_key(part *p, const char *key, uint64_t len, uint32_t type, uint64_t at,
                   const value_info *v) {
    if (key_is(key, len, "general.alignment")) {
        if (type != V_U32)
            return bad(p, "general.alignment at offset %llu has type %s, must be UINT32", ULL(at),
                       value_type_name[type]);
        if (v->u == 0 || (v->u & (v->u - 1)))
            return bad(p, "general.alignment %llu at offset %llu is not a power of two", ULL(v->u),
                       ULL(at + 4));
        p->alignment = v->u;
        return 0;
    }
    split_key *k = key_is(key, len, "split.no")              ? &p->split_no
                   : key_is(key, len, "split.count")         ? &p->split_count
                   : key_is(key, len, "split.tensors.count") ? &p->split_tensors
                                                             : NULL;
    if (!k) return 0;
    if (!is_integer_type(type))
        return bad(p, "%.*s at offset %llu has type %s, must be an integer", (int)len, key, ULL(at),
                   value_type_name[type]);
    if (v->negative) return bad(p, "%.*s at offset %llu is negative", (int)len, key, ULL(at + 4));
    *k = (split_key){true, v->u, at + 4};
    return 0;
}

static int read_kvs(part *p) {
    loader *ld = p->ld;
    strbuf *sb = &p->kv_json;
    hashmap keys;
    if (!hm_init(&keys, p->kv_count < 1024 ? p->kv_count : 1024))
        return ckpt_fail(ld->err, -ENOMEM, "out of memory");
    int rc = 0;
    uint64_t shown = 0;
    sb_putc(sb, '{');
    for (uint64_t i = 0; i < p->kv_count && !rc; i++) {
        snprintf(p->ctx, sizeof p->ctx, "KV %llu", ULL(i));
        uint64_t key_at = p->pos, len;
        char *key;
        if ((rc = get_name(p, "key", &key, &len))) break;
        snprintf(p->ctx, sizeof p->ctx, "KV %llu \"%.*s\"", ULL(i), SHOWN_NAME(key, len));
        bool added;
        hm_entry *e = hm_put(&keys, key, len, key_at, &added);
        if (!e) {
            rc = ckpt_fail(ld->err, -ENOMEM, "out of memory");
            break;
        }
        if (!added) {
            rc = bad(p, "key at offset %llu appears twice (first at offset %llu)", ULL(key_at),
                     ULL(e->value));
            break;
        }
        uint64_t type_at = p->pos;
        uint32_t type;
        if ((rc = get_u32(p, "value type", &type))) break;
        if (type >= V_COUNT) {
            rc = bad(p, "value type %u at offset %llu is not a GGUF value type (0-12)", type,
                     ULL(type_at));
            break;
        }
        /* Past the size limit a KV is left out entirely; a value that crosses it is elided. */
        bool listed = sb->len <= DOC_LIMIT, show = listed;
        if (listed) {
            /* One KV a line, indented to sit inside metadata.json. */
            sb_puts(sb, shown++ ? ",\n    " : "\n    ");
            sb_json_str(sb, key, len);
            sb_puts(sb, ": ");
        } else {
            p->kv_hidden++;
        }
        size_t value_start = sb->len;
        value_info v = {0};
        if ((rc = read_value(p, type, 0, &show, &v))) break;
        if (listed && !show) {
            sb->len = value_start;
            put_elided(sb, type, &v);
        }
        rc = use_key(p, key, len, type, type_at, &v);
    }
    sb_puts(sb, shown ? "\n  }" : "}");
    hm_free(&keys);
    if (!rc && sb->failed) rc = ckpt_fail(ld->err, -ENOMEM, "out of memory");
    return rc;
}

/* ---- tensor infos and data ---- */

static int add_placed(part *p, placed pl) {
    if (GROW(p->placed, p->cap_placed, p->nplaced + 1))
        return ckpt_fail(p->ld->err, -ENOMEM, "out of memory");
    p->placed[p->nplaced++] = pl;
    return 0;
}

static int read_tensor_info(part *p, uint64_t i) {
    loader *ld = p->ld;
    snprintf(p->ctx, sizeof p->ctx, "tensor info %llu", ULL(i));
    uint64_t name_at = p->pos, len;
    char *name;
    int rc = get_name(p, "name", &name, &len);
    if (rc) return rc;
    snprintf(p->ctx, sizeof p->ctx, "tensor \"%.*s\"", SHOWN_NAME(name, len));
    bool added;
    if (!hm_put(&ld->names, name, len, 0, &added))
        return ckpt_fail(ld->err, -ENOMEM, "out of memory");
    if (!added) return bad(p, "duplicate tensor name at offset %llu (defined twice)", ULL(name_at));

    uint64_t at = p->pos;
    uint32_t ndim;
    if ((rc = get_u32(p, "n_dims", &ndim))) return rc;
    if (ndim > CKPT_MAX_DIMS)
        return bad(p, "n_dims %u at offset %llu exceeds %d (ggml itself allows 4)", ndim, ULL(at),
                   CKPT_MAX_DIMS);
    uint64_t ne[CKPT_MAX_DIMS], ne_at = p->pos;
    for (uint32_t d = 0; d < ndim; d++) {
        if ((rc = get_u64(p, "ne", &ne[d]))) return rc;
        if (ne[d] > INT64_MAX)
            return bad(p, "ne[%u] %llu at offset %llu is negative as ggml's int64", d, ULL(ne[d]),
                       ULL(p->pos - 8));
    }
    at = p->pos;
    uint32_t id;
    if ((rc = get_u32(p, "type", &id))) return rc;
    if (id >= GGML_TYPE_COUNT || !ggml_types[id].known) {
        if (id < GGML_TYPE_COUNT && ggml_types[id].removed)
            return bad(p, "ggml type %u (%s) at offset %llu was removed from ggml and has no size",
                       id, ggml_types[id].removed, ULL(at));
        return bad(p, "ggml type %u at offset %llu is unknown (known: 0-%d)", id, ULL(at),
                   GGML_TYPE_COUNT - 1);
    }
    ckpt_dtype dt = ggml_types[id].dtype;
    const ckpt_dtype_info *info = ckpt_dtype_info_of(dt);
    uint64_t offset_at = p->pos, offset;
    if ((rc = get_u64(p, "offset", &offset))) return rc;

    uint64_t ne0 = ndim ? ne[0] : 1, numel = 1, nbytes;
    if (ne0 % info->block)
        return bad(p, "ne[0] %llu at offset %llu is not a multiple of the %s block size %u",
                   ULL(ne0), ULL(ne_at), info->name, info->block);
    for (uint32_t d = 0; d < ndim; d++)
        if (__builtin_mul_overflow(numel, ne[d], &numel) || numel > INT64_MAX)
            return bad(p, "ne at offset %llu: the element count overflows 2^63", ULL(ne_at));
    if (__builtin_mul_overflow(numel / info->block, (uint64_t)info->block_bytes, &nbytes))
        return bad(p, "ne at offset %llu: the byte size overflows 2^64", ULL(ne_at));
    if (offset % p->alignment)
        return bad(p, "offset %llu at offset %llu is not a multiple of the alignment %llu",
                   ULL(offset), ULL(offset_at), ULL(p->alignment));

    uint64_t shape[CKPT_MAX_DIMS];
    for (uint32_t d = 0; d < ndim; d++) shape[d] = ne[ndim - 1 - d];
    size_t idx;
    if ((rc = catalog_add_tensor(ld->cat, name, len, dt, ndim, shape, &idx, ld->err))) return rc;
    char extra[160];
    snprintf(extra, sizeof extra,
             "\"ggml_type\": \"%s\", \"ggml_type_id\": %u, \"block_size\": %u, \"type_size\": %u",
             info->name, id, info->block, info->block_bytes);
    if ((rc = catalog_set_extra(ld->cat, idx, extra, ld->err))) return rc;
    return add_placed(p, (placed){idx, name, len, offset, offset_at, nbytes});
}

static int placed_cmp(const void *a, const void *b) {
    const placed *x = a, *y = b;
    if (x->offset != y->offset) return (x->offset > y->offset) - (x->offset < y->offset);
    return (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

/* Every tensor's bytes inside the file, none sharing a byte with another. */
static int place_data(part *p) {
    uint64_t a = p->alignment;
    p->data_offset = (p->pos + a - 1) / a * a;
    for (size_t i = 0; i < p->nplaced; i++) {
        const placed *t = &p->placed[i];
        if (p->data_offset > p->size || t->offset > p->size - p->data_offset ||
            t->nbytes > p->size - p->data_offset - t->offset) {
            snprintf(p->ctx, sizeof p->ctx, "tensor \"%.*s\"", SHOWN_NAME(t->name, t->name_len));
            return bad(p,
                       "data (offset %llu at offset %llu, %llu bytes, data section at %llu) runs "
                       "past the end of the file (size %llu)",
                       ULL(t->offset), ULL(t->offset_at), ULL(t->nbytes), ULL(p->data_offset),
                       ULL(p->size));
        }
    }
    if (p->nplaced > 1) qsort(p->placed, p->nplaced, sizeof *p->placed, placed_cmp);
    const placed *prev = NULL;
    for (size_t i = 0; i < p->nplaced; i++) {
        const placed *t = &p->placed[i];
        if (!t->nbytes) continue;
        if (prev && t->offset < prev->offset + prev->nbytes) {
            snprintf(p->ctx, sizeof p->ctx, "tensor \"%.*s\"", SHOWN_NAME(t->name, t->name_len));
            return bad(p,
                       "data at offset %llu (offset field at %llu) overlaps tensor \"%.*s\", "
                       "which ends at %llu",
                       ULL(p->data_offset + t->offset), ULL(t->offset_at),
                       SHOWN_NAME(prev->name, prev->name_len),
                       ULL(p->data_offset + prev->offset + prev->nbytes));
        }
        prev = t;
    }
    for (size_t i = 0; i < p->nplaced; i++) {
        const placed *t = &p->placed[i];
        int rc = catalog_add_piece(p->ld->cat, t->tensor, p->source, p->data_offset + t->offset,
                                   NULL, NULL, NULL, p->ld->err);
        if (rc) return rc;
    }
    return 0;
}

static int read_header(part *p) {
    int rc = need(p, 4, "magic");
    if (rc) return rc;
    if (memcmp(cur(p), "FUGG", 4) == 0)
        return bad(p, "magic \"FUGG\" at offset 0 marks a big-endian GGUF file, which is not "
                      "supported (only little-endian)");
    if (memcmp(cur(p), "GGUF", 4) != 0) return bad(p, "magic at offset 0 is not \"GGUF\"");
    p->pos = 4;
    if ((rc = get_u32(p, "version", &p->version))) return rc;
    if ((p->version & 0xFFFF) == 0 && p->version)
        return bad(p,
                   "version 0x%08x at offset 4 is byte-swapped: a big-endian GGUF file, which "
                   "is not supported (only little-endian)",
                   p->version);
    if (p->version == 1)
        return bad(p, "version 1 at offset 4 is not supported (GGUF v1 used 32-bit counts; only "
                      "versions 2 and 3 are read)");
    if (p->version != 2 && p->version != 3)
        return bad(p, "version %u at offset 4 is not supported (only versions 2 and 3)",
                   p->version);
    if ((rc = get_u64(p, "tensor_count", &p->tensor_count))) return rc;
    if ((rc = get_u64(p, "kv_count", &p->kv_count))) return rc;
    uint64_t left = p->size - p->pos;
    if (p->tensor_count > left / MIN_INFO_BYTES)
        return bad(p,
                   "tensor_count %llu at offset 8 needs at least %d bytes per tensor info, more "
                   "than the %llu left before the end of the file",
                   ULL(p->tensor_count), MIN_INFO_BYTES, ULL(left));
    if (p->kv_count > left / MIN_KV_BYTES)
        return bad(p,
                   "kv_count %llu at offset 16 needs at least %d bytes per KV, more than the "
                   "%llu left before the end of the file",
                   ULL(p->kv_count), MIN_KV_BYTES, ULL(left));
    if (p->tensor_count * MIN_INFO_BYTES > left - p->kv_count * MIN_KV_BYTES)
        return bad(p,
                   "kv_count %llu and tensor_count %llu at offset 8 need more than the %llu "
                   "bytes left before the end of the file",
                   ULL(p->kv_count), ULL(p->tensor_count), ULL(left));
    return 0;
}

static void part_free(part *p) {
    free(p->buf);
    free(p->placed);
    sb_free(&p->kv_json);
}

/* Reads one file completely: header, KVs, tensor infos, data placement. */
static int read_part(loader *ld, uint32_t source, part *p) {
    memset(p, 0, sizeof *p);
    p->ld = ld;
    p->source = source;
    p->path = ld->cat->sources[source].path;
    p->size = ld->cat->sources[source].size;
    p->alignment = DEFAULT_ALIGNMENT;
    sb_init(&p->kv_json);
    int rc = read_header(p);
    if (!rc) rc = read_kvs(p);
    for (uint64_t i = 0; i < p->tensor_count && !rc; i++) rc = read_tensor_info(p, i);
    p->ctx[0] = '\0';
    if (!rc) rc = place_data(p);
    p->ctx[0] = '\0';
    if (!rc && p->split_count.present && p->split_count.value == 0)
        rc = bad(p, "split.count 0 at offset %llu: a model has at least one part",
                 ULL(p->split_count.at));
    if (!rc && p->split_count.present && p->split_count.value > SPLIT_LIMIT)
        rc = bad(p, "split.count %llu at offset %llu exceeds %d", ULL(p->split_count.value),
                 ULL(p->split_count.at), SPLIT_LIMIT);
    if (!rc && p->split_no.present) {
        uint64_t n = p->split_count.present ? p->split_count.value : 1;
        if (p->split_no.value >= n)
            rc = bad(p, "split.no %llu at offset %llu is not below split.count %llu",
                     ULL(p->split_no.value), ULL(p->split_no.at), ULL(n));
    }
    free(p->buf);
    p->buf = NULL;
    free(p->placed);
    p->placed = NULL;
    if (p->kv_hidden)
        catalog_warn(ld->cat, "%s: metadata.json leaves out the last %llu KVs (size limit %d MiB)",
                     p->path, ULL(p->kv_hidden), DOC_LIMIT >> 20);
    return rc;
}

/* ---- split models ---- */

/* Recognizes llama.cpp's part names, PREFIX-%05d-of-%05d.gguf, exactly as it writes them. */
static bool split_name(const char *base, size_t *prefix_len, unsigned long *no,
                       unsigned long *count) {
    size_t n = strlen(base);
    if (n < 5 || strcmp(base + n - 5, ".gguf") != 0) return false;
    const char *of = NULL;
    for (const char *s = base; (s = strstr(s, "-of-")) && s < base + n - 5; s++) of = s;
    if (!of) return false;
    const char *d = of;
    while (d > base && d[-1] >= '0' && d[-1] <= '9') d--;
    if (d == of || d == base || d[-1] != '-' || of - d > 9 || base + n - 5 - (of + 4) > 9)
        return false;
    char *end;
    *no = strtoul(d, &end, 10);
    if (end != of) return false;
    *count = strtoul(of + 4, &end, 10);
    if (end != base + n - 5) return false;
    *prefix_len = (size_t)(d - 1 - base);
    char again[64];
    int len = snprintf(again, sizeof again, "-%05lu-of-%05lu.gguf", *no, *count);
    return len > 0 && (size_t)len == n - *prefix_len && strcmp(again, base + *prefix_len) == 0;
}

typedef struct part_summary {
    uint32_t source;
    uint32_t version;
    uint64_t tensor_count, kv_count, alignment, data_offset;
    split_key split_tensors;
} part_summary;

static part_summary summarize(const part *p) {
    return (part_summary){p->source,    p->version,     p->tensor_count, p->kv_count,
                          p->alignment, p->data_offset, p->split_tensors};
}

static int add_docs(loader *ld, const strbuf *kvs, const part_summary *parts, size_t n) {
    int rc = catalog_add_doc(ld->cat, "gguf", kvs->data, kvs->len, ld->err);
    if (rc) return rc;
    strbuf sb;
    sb_init(&sb);
    sb_putc(&sb, '[');
    for (size_t i = 0; i < n; i++) {
        const part_summary *s = &parts[i];
        const char *rel = ld->cat->sources[s->source].relpath;
        sb_puts(&sb, i ? ", {\"file\": " : "{\"file\": ");
        sb_json_str(&sb, rel, strlen(rel));
        sb_printf(&sb,
                  ", \"version\": %u, \"tensor_count\": %llu, \"kv_count\": %llu, "
                  "\"alignment\": %llu, \"data_offset\": %llu}",
                  s->version, ULL(s->tensor_count), ULL(s->kv_count), ULL(s->alignment),
                  ULL(s->data_offset));
    }
    sb_putc(&sb, ']');
    rc = sb.failed ? ckpt_fail(ld->err, -ENOMEM, "out of memory")
                   : catalog_add_doc(ld->cat, "gguf_files", sb.data, sb.len, ld->err);
    sb_free(&sb);
    return rc;
}

/* Loads the other parts of the split model that `first` (the opened file) belongs to. */
static int load_split(loader *ld, part *opened) {
    ckpt_catalog *cat = ld->cat;
    const char *path = opened->path;
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    size_t dir_len = slash ? (size_t)(slash - path) + 1 : 0;
    uint64_t count = opened->split_count.value;
    size_t prefix_len;
    unsigned long name_no, name_count;
    if (!split_name(base, &prefix_len, &name_no, &name_count))
        return bad(opened,
                   "split.count %llu at offset %llu says this is one part of a split model, "
                   "but the file name does not follow PREFIX-00001-of-%05llu.gguf, so the other "
                   "parts cannot be found",
                   ULL(count), ULL(opened->split_count.at), ULL(count));
    if (name_count != count)
        return bad(opened, "split.count %llu at offset %llu does not match the file name (of %lu)",
                   ULL(count), ULL(opened->split_count.at), name_count);
    if (!opened->split_no.present)
        return bad(opened, "split.no is missing from a part of a split model (split.count %llu)",
                   ULL(count));
    if (name_no != opened->split_no.value + 1)
        return bad(opened,
                   "split.no %llu at offset %llu does not match the file name (part %lu, which "
                   "has split.no %lu)",
                   ULL(opened->split_no.value), ULL(opened->split_no.at), name_no, name_no - 1);

    part_summary *sum = calloc(count, sizeof *sum);
    strbuf kvs;
    sb_init(&kvs);
    if (!sum) return ckpt_fail(ld->err, -ENOMEM, "out of memory");
    sum[opened->split_no.value] = summarize(opened);
    if (opened->split_no.value == 0) {
        kvs = opened->kv_json;
        sb_init(&opened->kv_json);
    }
    uint64_t total = opened->tensor_count;
    int rc = 0;
    char *other = malloc(dir_len + prefix_len + 64);
    if (!other) rc = ckpt_fail(ld->err, -ENOMEM, "out of memory");
    for (uint64_t k = 1; k <= count && !rc; k++) {
        if (k == name_no) continue;
        snprintf(other, dir_len + prefix_len + 64, "%.*s%.*s-%05llu-of-%05llu.gguf", (int)dir_len,
                 path, (int)prefix_len, base, ULL(k), ULL(count));
        const char *other_base = other + dir_len;
        if (place_kind(other) == PLACE_MISSING) {
            rc = bad(opened,
                     "split part %s is missing (split.count %llu at offset %llu names %llu parts)",
                     other_base, ULL(count), ULL(opened->split_count.at), ULL(count));
            break;
        }
        uint32_t src;
        if ((rc = catalog_add_source(cat, other, other_base, &src, ld->err))) break;
        part q;
        rc = read_part(ld, src, &q);
        if (!rc && !q.split_count.present)
            rc = bad(&q, "split.count is missing, but %s says the model has %llu parts", base,
                     ULL(count));
        if (!rc && q.split_count.value != count)
            rc = bad(&q, "split.count %llu at offset %llu does not match split.count %llu of %s",
                     ULL(q.split_count.value), ULL(q.split_count.at), ULL(count), base);
        if (!rc && !q.split_no.present)
            rc = bad(&q, "split.no is missing from a part of a split model");
        if (!rc && q.split_no.value != k - 1)
            rc = bad(&q,
                     "split.no %llu at offset %llu does not match the file name (part %llu, "
                     "which has split.no %llu)",
                     ULL(q.split_no.value), ULL(q.split_no.at), ULL(k), ULL(k - 1));
        if (!rc) {
            sum[k - 1] = summarize(&q);
            total += q.tensor_count;
            if (k == 1) {
                kvs = q.kv_json;
                sb_init(&q.kv_json);
            }
        }
        part_free(&q);
    }
    for (uint64_t k = 0; k < count && !rc; k++) {
        const split_key *st = &sum[k].split_tensors;
        if (st->present && st->value != total)
            rc = ckpt_fail(ld->err, -EINVAL,
                           "%s: split.tensors.count %llu at offset %llu does not match the %llu "
                           "tensors in the %llu parts",
                           cat->sources[sum[k].source].path, ULL(st->value), ULL(st->at),
                           ULL(total), ULL(count));
    }
    if (!rc) rc = add_docs(ld, &kvs, sum, count);
    free(other);
    free(sum);
    sb_free(&kvs);
    return rc;
}

static int load(ckpt_catalog *cat, uint32_t source, ckpt_err *err) {
    loader ld = {cat, err, {0}, {0}};
    arena_init(&ld.mem);
    if (!hm_init(&ld.names, 64)) return ckpt_fail(err, -ENOMEM, "out of memory");
    part p;
    int rc = read_part(&ld, source, &p);
    if (!rc) {
        if (p.split_count.present && p.split_count.value > 1) {
            rc = load_split(&ld, &p);
        } else {
            if (p.split_tensors.present && p.split_tensors.value != p.tensor_count)
                rc = bad(&p,
                         "split.tensors.count %llu at offset %llu does not match the %llu "
                         "tensors in the file",
                         ULL(p.split_tensors.value), ULL(p.split_tensors.at), ULL(p.tensor_count));
            part_summary s = summarize(&p);
            if (!rc) rc = add_docs(&ld, &p.kv_json, &s, 1);
        }
    }
    part_free(&p);
    hm_free(&ld.names);
    arena_free(&ld.mem);
    return rc;
}

const ckpt_format format_gguf = {.name = "gguf", .label = "GGUF", .probe = probe, .load = load};
