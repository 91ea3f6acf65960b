/* burnpack: Burn's .bpk container (tracel-ai/burn, burn-store/burnpack and burn-pack).
 *
 *   0   4  magic "NRUB" (u32 LE 0x4255524E)
 *   4   2  version u16 LE (1; readers refuse > 1)
 *   6   4  metadata_size M, u32 LE
 *   10  M  CBOR map {"tensors": {name: descriptor}, "metadata"?: {..}, "scalars"?: {..}}
 *      then the data section; descriptors hold data_offsets [start, end) relative to it.
 *
 * Two layouts share version 1: since burn 0.20.0-pre.5 the data section starts at
 * align(10 + M, 256) and every tensor starts on a 256-byte boundary; before that the data section
 * started right after the CBOR and tensors were packed. The layout is inferred from the offsets
 * and the file size (detect_layout).
 *
 * The CBOR is read with libcbor's streaming decoder, one item at a time, straight from the
 * metadata buffer: nothing is allocated per CBOR item, so a hostile 100 MiB map costs its bytes
 * and no more (cbor_load would allocate a node per item). Declared counts are never used to size
 * anything; nesting is limited to Burn's own MAX_CBOR_RECURSION_DEPTH.
 *
 * Burn dtypes map onto ckptfs dtypes by element layout: Flex32 is stored as F32; Bool (text, burn
 * <= 0.21.0-pre.2) and {"Bool": "Native" | "U8"} are one byte per element (BOOL); {"Bool": "U32"}
 * is four (U32). QFloat tensors are bit-packed values plus scales in a layout that belongs to
 * Burn's quantizer, so they are shown as opaque bytes: U8 [nbytes] with "quantized": true and
 * the logical shape as "burn_shape". Every sidecar carries the original dtype value as
 * "burn_dtype" (JSON of the CBOR) and "param_id" when the file has one.
 *
 * Beyond Burn's own reader (which checks neither), byte lengths must equal numel x element size
 * for every non-quantized tensor and tensors must not overlap: Burn never writes either, and a
 * mount should not show bytes that belong to two tensors. Unknown keys are ignored, tags are
 * skipped, integer widths and indefinite lengths are accepted, as ciborium accepts them.
 *
 * .ckptfs/metadata.json gets one member "burnpack": {version, metadata_size, layout
 * ("aligned" | "unaligned"), data_start, tensor_count, and when present "metadata", "scalars"
 * and "unknown_keys" (other top-level keys), converted from CBOR as value() describes}. */
#include "formats.h"
#include "../util/grow.h"
#include "../util/le.h"

#include "../util/strbuf.h"

#include <cbor.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    HEADER_BYTES = 10,
    DATA_ALIGN = 256,
    MAX_DEPTH = 128,         /* Burn: MAX_CBOR_RECURSION_DEPTH */
    MAX_TENSORS = 100000,    /* Burn: MAX_TENSOR_COUNT */
    DTYPE_JSON_LIMIT = 1024, /* a real QuantScheme renders to ~100 bytes */
    DOC_JSON_LIMIT = 8 << 20,
};
#define METADATA_LIMIT 104857600u /* Burn: MAX_METADATA_SIZE, 100 MiB */

static const unsigned char MAGIC[4] = {'N', 'R', 'U', 'B'};

static bool probe(const unsigned char *head, size_t n, uint64_t file_size) {
    (void)file_size;
    return n >= sizeof MAGIC && memcmp(head, MAGIC, sizeof MAGIC) == 0;
}

/* ---- one CBOR item at a time over the metadata buffer ---- */

typedef enum {
    K_UINT,
    K_NEGINT,
    K_BYTES,
    K_TEXT,
    K_ARRAY,
    K_MAP,
    K_TAG,
    K_FLOAT,
    K_BOOL,
    K_NULL,
    K_UNDEFINED,
    K_BREAK
} item_kind;

/* For messages: "... is a map, not an array". */
static const char *const KIND_NAME[] = {
    "an unsigned integer",
    "a negative integer",
    "a byte string",
    "a text string",
    "an array",
    "a map",
    "a tag",
    "a float",
    "a boolean",
    "null",
    "undefined",
    "a break",
};

typedef struct item {
    item_kind kind;
    bool indefinite; /* strings, arrays, maps: members follow until a break */
    uint64_t u;      /* integer argument (a negint is -1 - u), length, count, tag, boolean */
    double f;
    unsigned float_bits;
    const unsigned char *data; /* definite strings: points into the metadata buffer */
    unsigned long long at;     /* file offset of the item (printed in messages) */
} item;

typedef struct reader {
    const unsigned char *buf;
    size_t len, pos;
    const char *path;
    ckpt_err *err;
    item *cur; /* where the callbacks write */
    /* the tensor being parsed, named in messages */
    const char *tensor;
    size_t tensor_len;
    /* JSON rendering stops (and sets overflow) past this many bytes */
    size_t json_limit;
    bool overflow;
} reader;

#define AT(pos) ((unsigned long long)(HEADER_BYTES + (uint64_t)(pos)))

static int bad(reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(reader *r, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (r->tensor)
        return ckpt_fail(r->err, -EINVAL, "%s: tensor \"%.*s\": %s", r->path,
                         SHOWN_NAME(r->tensor, r->tensor_len), msg);
    return ckpt_fail(r->err, -EINVAL, "%s: %s", r->path, msg);
}

static void set(void *ctx, item_kind kind, uint64_t u) {
    item *it = ((reader *)ctx)->cur;
    it->kind = kind;
    it->u = u;
}
static void on_uint8(void *c, uint8_t v) {
    set(c, K_UINT, v);
}
static void on_uint16(void *c, uint16_t v) {
    set(c, K_UINT, v);
}
static void on_uint32(void *c, uint32_t v) {
    set(c, K_UINT, v);
}
static void on_uint64(void *c, uint64_t v) {
    set(c, K_UINT, v);
}
static void on_negint8(void *c, uint8_t v) {
    set(c, K_NEGINT, v);
}
static void on_negint16(void *c, uint16_t v) {
    set(c, K_NEGINT, v);
}
static void on_negint32(void *c, uint32_t v) {
    set(c, K_NEGINT, v);
}
static void on_negint64(void *c, uint64_t v) {
    set(c, K_NEGINT, v);
}
static void on_bytes(void *c, cbor_data data, size_t len) {
    set(c, K_BYTES, len);
    ((reader *)c)->cur->data = data;
}
static void on_text(void *c, cbor_data data, size_t len) {
    set(c, K_TEXT, len);
    ((reader *)c)->cur->data = data;
}
static void on_bytes_start(void *c) {
    set(c, K_BYTES, 0);
    ((reader *)c)->cur->indefinite = true;
}
static void on_text_start(void *c) {
    set(c, K_TEXT, 0);
    ((reader *)c)->cur->indefinite = true;
}
static void on_array(void *c, size_t n) {
    set(c, K_ARRAY, n);
}
static void on_array_start(void *c) {
    set(c, K_ARRAY, 0);
    ((reader *)c)->cur->indefinite = true;
}
static void on_map(void *c, size_t n) {
    set(c, K_MAP, n);
}
static void on_map_start(void *c) {
    set(c, K_MAP, 0);
    ((reader *)c)->cur->indefinite = true;
}
static void on_tag(void *c, uint64_t v) {
    set(c, K_TAG, v);
}
static void on_float(reader *r, double f, unsigned bits) {
    set(r, K_FLOAT, 0);
    r->cur->f = f;
    r->cur->float_bits = bits;
}
static void on_float2(void *c, float f) {
    on_float(c, f, 16);
}
static void on_float4(void *c, float f) {
    on_float(c, f, 32);
}
static void on_float8(void *c, double f) {
    on_float(c, f, 64);
}
static void on_undefined(void *c) {
    set(c, K_UNDEFINED, 0);
}
static void on_null(void *c) {
    set(c, K_NULL, 0);
}
static void on_bool(void *c, bool b) {
    set(c, K_BOOL, b);
}
static void on_break(void *c) {
    set(c, K_BREAK, 0);
}

static const struct cbor_callbacks CALLBACKS = {
    .uint8 = on_uint8,
    .uint16 = on_uint16,
    .uint32 = on_uint32,
    .uint64 = on_uint64,
    .negint8 = on_negint8,
    .negint16 = on_negint16,
    .negint32 = on_negint32,
    .negint64 = on_negint64,
    .byte_string_start = on_bytes_start,
    .byte_string = on_bytes,
    .string = on_text,
    .string_start = on_text_start,
    .indef_array_start = on_array_start,
    .array_start = on_array,
    .indef_map_start = on_map_start,
    .map_start = on_map,
    .tag = on_tag,
    .float2 = on_float2,
    .float4 = on_float4,
    .float8 = on_float8,
    .undefined = on_undefined,
    .null = on_null,
    .boolean = on_bool,
    .indef_break = on_break,
};

/* Decodes the item header at r->pos (and a definite string's bytes). */
static int next_item(reader *r, item *it) {
    memset(it, 0, sizeof *it);
    it->at = AT(r->pos);
    if (r->pos >= r->len)
        return bad(r,
                   "metadata ends at offset %llu in the middle of a CBOR item (metadata_size %zu)",
                   AT(r->len), r->len);
    r->cur = it;
    struct cbor_decoder_result res =
        cbor_stream_decode(r->buf + r->pos, r->len - r->pos, &CALLBACKS, r);
    if (res.status == CBOR_DECODER_NEDATA)
        return bad(r,
                   "CBOR item at offset %llu runs past the end of the metadata (metadata_size %zu "
                   "ends at offset %llu)",
                   it->at, r->len, AT(r->len));
    if (res.status != CBOR_DECODER_FINISHED || res.read == 0)
        return bad(r, "metadata: malformed CBOR item (initial byte 0x%02x) at offset %llu",
                   r->buf[r->pos], it->at);
    r->pos += res.read;
    return 0;
}

/* The next data item, tags skipped (Burn writes none; other writers may). A break is an error
 * here: callers that accept one read it with next_item. */
static int next_value(reader *r, item *it) {
    int rc;
    do {
        if ((rc = next_item(r, it))) return rc;
    } while (it->kind == K_TAG);
    if (it->kind == K_BREAK)
        return bad(r, "unexpected CBOR break (0xff) at offset %llu where a value belongs", it->at);
    return 0;
}

/* Iterates the members of an array or map opened by `open` (a map yields keys and values in
 * turn). Returns 1 with *it set, 0 at the end, <0 on error. */
typedef struct members {
    bool indefinite;
    uint64_t left;
} members;

static int open_members(reader *r, const item *open, members *m) {
    m->indefinite = open->indefinite;
    m->left = open->u;
    /* Every member takes at least one byte: a count the rest of the metadata cannot hold is a
     * lie, and refusing it here keeps the arithmetic below in range. */
    uint64_t room = r->len - r->pos;
    if (!open->indefinite && (open->kind == K_MAP ? open->u > room / 2 : open->u > room))
        return bad(r,
                   "CBOR %s count %llu at offset %llu exceeds the %llu bytes left in the metadata",
                   open->kind == K_MAP ? "map" : "array", (unsigned long long)open->u, open->at,
                   (unsigned long long)room);
    if (open->kind == K_MAP && !open->indefinite) m->left *= 2;
    return 0;
}

static int next_member(reader *r, members *m, item *it) {
    if (!m->indefinite) {
        if (m->left == 0) return 0;
        m->left--;
    }
    int rc;
    do {
        if ((rc = next_item(r, it))) return rc;
    } while (it->kind == K_TAG);
    if (it->kind == K_BREAK) {
        if (m->indefinite) return 0;
        return bad(r, "unexpected CBOR break (0xff) at offset %llu inside a definite-length item",
                   it->at);
    }
    return 1;
}

/* A map value: must follow its key, so a break is an error even in an indefinite map. Callers
 * that parse the value themselves call take_value and then next_value. */
static void take_value(members *m) {
    if (!m->indefinite) m->left--;
}

static int next_map_value(reader *r, members *m, item *it) {
    take_value(m);
    return next_value(r, it);
}

/* Text or byte string contents: definite ones point into the buffer, indefinite ones are
 * joined into scratch. */
static int string_bytes(reader *r, const item *it, strbuf *scratch, const char **s, size_t *n) {
    if (!it->indefinite) {
        *s = (const char *)it->data;
        *n = it->u;
        return 0;
    }
    sb_clear(scratch);
    for (;;) {
        item chunk;
        int rc = next_item(r, &chunk);
        if (rc) return rc;
        if (chunk.kind == K_BREAK) break;
        if (chunk.kind != it->kind || chunk.indefinite)
            return bad(r, "CBOR %s chunk at offset %llu is %s%s",
                       it->kind == K_TEXT ? "text string" : "byte string", chunk.at,
                       chunk.indefinite ? "indefinite: " : "", KIND_NAME[chunk.kind]);
        sb_put(scratch, chunk.data, chunk.u);
    }
    if (scratch->failed) return ckpt_fail(r->err, -ENOMEM, "out of memory");
    *s = scratch->len ? scratch->data : "";
    *n = scratch->len;
    return 0;
}

static bool text_is(const char *s, size_t n, const char *want) {
    return strlen(want) == n && memcmp(s, want, n) == 0;
}

/* Shortest decimal that reads back as the same double: a half or single widens exactly to a
 * double, so printing the double keeps the exact value and a writer can re-encode the same
 * CBOR float (printing at float precision would turn 0.1f into 0.1, another number). */
static void put_float(strbuf *out, double f, unsigned bits) {
    (void)bits;
    if (isnan(f)) {
        sb_puts(out, "\"NaN\"");
        return;
    }
    if (isinf(f)) {
        sb_puts(out, f > 0 ? "\"Infinity\"" : "\"-Infinity\"");
        return;
    }
    char buf[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, f);
        if (strtod(buf, NULL) == f) break;
    }
    sb_puts(out, buf);
    /* JSON readers that tell integers from floats should see a float. */
    if (!strpbrk(buf, ".eEn")) sb_puts(out, ".0");
}

static void put_hex(strbuf *out, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char h[2] = {hex[c >> 4], hex[c & 15]};
        sb_put(out, h, 2);
    }
}

/* Consumes the value `it` (its header already read) and, when out is non-NULL, appends it as
 * JSON. CBOR without a JSON equivalent: byte strings become lowercase hex strings, tags are
 * dropped (the tagged value stays), undefined becomes null, NaN and infinities become the
 * strings "NaN", "Infinity", "-Infinity", non-text map keys become their JSON text. */
static int key_text(reader *r, const item *it, int depth, strbuf *out);
/* Where each key of one map stands in the rendered JSON text (offsets: the text may move). */
typedef struct key_spans {
    size_t (*span)[2];
    size_t n, cap;
} key_spans;

static bool key_spans_add(key_spans *k, size_t start, size_t len) {
    if (k->n == k->cap) {
        size_t cap = k->cap ? 2 * k->cap : 8;
        void *p = realloc(k->span, cap * sizeof *k->span);
        if (!p) return false;
        k->span = p;
        k->cap = cap;
    }
    k->span[k->n][0] = start;
    k->span[k->n][1] = len;
    k->n++;
    return true;
}

static int key_span_cmp(const void *a, const void *b, void *text) {
    const size_t *x = a, *y = b;
    const char *t = text;
    size_t n = x[1] < y[1] ? x[1] : y[1];
    int c = memcmp(t + x[0], t + y[0], n);
    return c ? c : (x[1] > y[1]) - (x[1] < y[1]);
}

/* Sorts the spans by their text; true (and the key) when two are equal. */
static bool key_spans_repeat(key_spans *k, const char *text, const char **key, size_t *len) {
    if (k->n < 2) return false;
    qsort_r(k->span, k->n, sizeof *k->span, key_span_cmp, (void *)text);
    for (size_t i = 1; i < k->n; i++)
        if (key_span_cmp(k->span[i - 1], k->span[i], (void *)text) == 0) {
            *key = text + k->span[i][0];
            *len = k->span[i][1];
            return true;
        }
    return false;
}

static int value(reader *r, const item *it, unsigned depth, strbuf *out) {
    if (depth > MAX_DEPTH)
        return bad(r, "metadata: CBOR nesting deeper than %d levels at offset %llu", MAX_DEPTH,
                   it->at);
    if (out && out->len > r->json_limit) {
        r->overflow = true;
        out = NULL;
    }
    int rc = 0;
    switch (it->kind) {
    case K_UINT:
        if (out) sb_u64(out, it->u);
        return 0;
    case K_NEGINT:
        if (out) {
            sb_putc(out, '-');
            if (it->u == UINT64_MAX)
                sb_puts(out, "18446744073709551616");
            else
                sb_u64(out, it->u + 1);
        }
        return 0;
    case K_FLOAT:
        if (out) put_float(out, it->f, it->float_bits);
        return 0;
    case K_BOOL:
        if (out) sb_puts(out, it->u ? "true" : "false");
        return 0;
    case K_NULL:
    case K_UNDEFINED:
        if (out) sb_puts(out, "null");
        return 0;
    case K_TAG: {
        item inner;
        if ((rc = next_item(r, &inner))) return rc;
        if (inner.kind == K_BREAK)
            return bad(r, "CBOR tag at offset %llu is followed by a break", it->at);
        return value(r, &inner, depth + 1, out);
    }
    case K_BYTES:
    case K_TEXT: {
        strbuf scratch;
        sb_init(&scratch);
        const char *s;
        size_t n;
        rc = string_bytes(r, it, &scratch, &s, &n);
        /* A long string is refused before it is escaped (up to 6 bytes per byte). */
        if (out && n > (r->json_limit - out->len) / (it->kind == K_TEXT ? 1 : 2)) {
            r->overflow = true;
            out = NULL;
        }
        if (!rc && out) {
            if (it->kind == K_TEXT) {
                sb_json_str(out, s, n);
            } else {
                sb_putc(out, '"');
                put_hex(out, s, n);
                sb_putc(out, '"');
            }
        }
        sb_free(&scratch);
        return rc;
    }
    case K_ARRAY:
    case K_MAP: {
        bool map = it->kind == K_MAP;
        members m;
        if ((rc = open_members(r, it, &m))) return rc;
        if (out) sb_putc(out, map ? '{' : '[');
        item el;
        key_spans keys = {0};
        for (bool first = true; (rc = next_member(r, &m, &el)) == 1; first = false) {
            if (out && out->len > r->json_limit) {
                r->overflow = true;
                out = NULL;
            }
            if (out && !first) sb_puts(out, ", ");
            size_t key_start = out ? out->len : 0;
            if (map && out && el.kind != K_TEXT) {
                /* A JSON key must be a string: use the key's own JSON text, rendered under a
                 * small budget: nested keys are escaped once per level, which must not grow
                 * exponentially with the nesting. */
                strbuf key;
                sb_init(&key);
                rc = key_text(r, &el, depth + 1, &key);
                if (!rc) sb_json_str(out, key.data ? key.data : "", key.len);
                sb_free(&key);
            } else {
                rc = value(r, &el, depth + 1, out);
            }
            if (!rc && map && out && !key_spans_add(&keys, key_start, out->len - key_start))
                rc = -ENOMEM;
            if (rc) break;
            if (map) {
                if (out) sb_puts(out, ": ");
                if ((rc = next_map_value(r, &m, &el)) || (rc = value(r, &el, depth + 1, out)))
                    break;
            }
        }
        /* JSON readers keep one of two equal keys: a map whose keys repeat (in CBOR, or once
         * rendered as JSON text) would lose a value without a word. Refused instead. */
        const char *twice = NULL;
        size_t twice_len = 0;
        if (rc >= 0 && out && key_spans_repeat(&keys, out->data, &twice, &twice_len))
            rc = bad(r, "metadata: the CBOR map at offset %llu has the key %.*s twice", it->at,
                     (int)(twice_len > 80 ? 80 : twice_len), twice);
        free(keys.span);
        if (rc < 0) return rc;
        if (out) sb_putc(out, map ? '}' : ']');
        return 0;
    }
    case K_BREAK:
        break;
    }
    return bad(r, "unexpected CBOR break (0xff) at offset %llu", it->at);
}

/* A non-text map key as JSON text, at most KEY_JSON_LIMIT bytes ("<long key>" beyond). */
enum { KEY_JSON_LIMIT = 1024 };
static int key_text(reader *r, const item *it, int depth, strbuf *out) {
    size_t saved_limit = r->json_limit;
    bool saved_overflow = r->overflow;
    if (r->json_limit > KEY_JSON_LIMIT) r->json_limit = KEY_JSON_LIMIT;
    r->overflow = false;
    int rc = value(r, it, depth, out);
    bool long_key = r->overflow || out->len > KEY_JSON_LIMIT;
    r->json_limit = saved_limit;
    r->overflow = saved_overflow;
    if (!rc && long_key) {
        sb_clear(out);
        sb_puts(out, "<long key>");
    }
    return rc;
}

/* Renders the value that starts at buffer position pos into out, then returns to where the
 * reader was. Used to keep the original dtype value next to its interpretation. */
static int render_at(reader *r, size_t pos, unsigned depth, size_t limit, strbuf *out) {
    size_t saved = r->pos;
    size_t saved_limit = r->json_limit;
    r->pos = pos;
    r->json_limit = out->len + limit;
    r->overflow = false;
    item it;
    int rc = next_value(r, &it);
    if (!rc) rc = value(r, &it, depth, out);
    if (out->len > r->json_limit) r->overflow = true;
    r->pos = saved;
    r->json_limit = saved_limit;
    return rc;
}

/* ---- the schema ---- */

typedef struct unit_dtype {
    const char *name;
    ckpt_dtype dtype;
} unit_dtype;

/* Burn's unit DType variants by name (burn-std dtype.rs); the order on disk does not matter. */
static const unit_dtype UNIT_DTYPES[] = {
    {"F64", CKPT_F64},   {"F32", CKPT_F32},   {"Flex32", CKPT_F32}, {"F16", CKPT_F16},
    {"BF16", CKPT_BF16}, {"I64", CKPT_I64},   {"I32", CKPT_I32},    {"I16", CKPT_I16},
    {"I8", CKPT_I8},     {"U64", CKPT_U64},   {"U32", CKPT_U32},    {"U16", CKPT_U16},
    {"U8", CKPT_U8},     {"Bool", CKPT_BOOL},
};

typedef struct descriptor {
    bool has_dtype, has_shape, has_offsets, seen_param_id, has_param_id;
    ckpt_dtype dtype;
    bool quantized;
    uint32_t ndim;
    uint64_t shape[CKPT_MAX_DIMS];
    uint64_t start, end, param_id;
    unsigned long long at, dtype_at, shape_at, offsets_at; /* file offsets, for messages */
    size_t dtype_pos; /* buffer position of the dtype value, to render it as burn_dtype */
} descriptor;

static void shape_text(char *buf, size_t cap, const uint64_t *shape, uint32_t ndim) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (uint32_t d = 0; d < ndim && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%llu", d ? ", " : "",
                              (unsigned long long)shape[d]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

static int parse_dtype(reader *r, descriptor *d, strbuf *scratch) {
    item v;
    int rc = next_value(r, &v);
    if (rc) return rc;
    d->dtype_at = v.at;
    const char *s;
    size_t n;
    if (v.kind == K_TEXT) {
        if ((rc = string_bytes(r, &v, scratch, &s, &n))) return rc;
        for (size_t i = 0; i < sizeof UNIT_DTYPES / sizeof *UNIT_DTYPES; i++) {
            if (text_is(s, n, UNIT_DTYPES[i].name)) {
                d->dtype = UNIT_DTYPES[i].dtype;
                return 0;
            }
        }
        return bad(r,
                   "dtype \"%.*s\" at offset %llu is not a Burn dtype (F64 F32 Flex32 F16 BF16 "
                   "I64 I32 I16 I8 U64 U32 U16 U8 Bool, or a Bool or QFloat map)",
                   (int)(n > 40 ? 40 : n), s, v.at);
    }
    if (v.kind != K_MAP)
        return bad(r, "dtype at offset %llu is %s, not a text string or a 1-entry map", v.at,
                   KIND_NAME[v.kind]);
    /* A data-carrying variant: {name: payload}, exactly one entry. */
    members m;
    if ((rc = open_members(r, &v, &m))) return rc;
    if (!v.indefinite && v.u != 1)
        return bad(r, "dtype map at offset %llu has %llu entries, want 1", v.at,
                   (unsigned long long)v.u);
    item key, payload;
    if ((rc = next_member(r, &m, &key)) < 0) return rc;
    if (rc == 0) return bad(r, "dtype map at offset %llu is empty, want 1 entry", v.at);
    if (key.kind != K_TEXT)
        return bad(r, "dtype variant at offset %llu is %s, not a text string", key.at,
                   KIND_NAME[key.kind]);
    if ((rc = string_bytes(r, &key, scratch, &s, &n))) return rc;
    if ((rc = next_map_value(r, &m, &payload))) return rc;
    if (text_is(s, n, "Bool")) {
        /* burn >= 0.21.0-pre.3: {"Bool": storage} */
        if (payload.kind != K_TEXT)
            return bad(r, "dtype Bool storage at offset %llu is %s, not a text string", payload.at,
                       KIND_NAME[payload.kind]);
        if ((rc = string_bytes(r, &payload, scratch, &s, &n))) return rc;
        if (text_is(s, n, "Native") || text_is(s, n, "U8"))
            d->dtype = CKPT_BOOL;
        else if (text_is(s, n, "U32"))
            d->dtype = CKPT_U32;
        else
            return bad(r, "dtype Bool storage \"%.*s\" at offset %llu is not Native, U8 or U32",
                       (int)(n > 40 ? 40 : n), s, payload.at);
    } else if (text_is(s, n, "QFloat")) {
        d->quantized = true;
        d->dtype = CKPT_U8;
        if ((rc = value(r, &payload, 5, NULL))) return rc;
    } else {
        return bad(r, "dtype variant \"%.*s\" at offset %llu is not Bool or QFloat",
                   (int)(n > 40 ? 40 : n), s, key.at);
    }
    if (v.indefinite) {
        if ((rc = next_member(r, &m, &key)) < 0) return rc;
        if (rc == 1) return bad(r, "dtype map at offset %llu has more than 1 entry", v.at);
    }
    return 0;
}

static int parse_u64(reader *r, const item *v, const char *field, uint64_t *out) {
    if (v->kind != K_UINT)
        return bad(r, "%s at offset %llu is %s, not an unsigned integer", field, v->at,
                   KIND_NAME[v->kind]);
    *out = v->u;
    return 0;
}

static int parse_shape(reader *r, descriptor *d) {
    item a, el;
    int rc = next_value(r, &a);
    if (rc) return rc;
    d->shape_at = a.at;
    if (a.kind != K_ARRAY)
        return bad(r, "shape at offset %llu is %s, not an array", a.at, KIND_NAME[a.kind]);
    members m;
    if ((rc = open_members(r, &a, &m))) return rc;
    d->ndim = 0;
    while ((rc = next_member(r, &m, &el)) == 1) {
        if (d->ndim == CKPT_MAX_DIMS)
            return bad(r, "shape at offset %llu has more than %d dims", a.at, CKPT_MAX_DIMS);
        if ((rc = parse_u64(r, &el, "shape dim", &d->shape[d->ndim]))) return rc;
        d->ndim++;
    }
    return rc;
}

static int parse_offsets(reader *r, descriptor *d) {
    item a, el;
    int rc = next_value(r, &a);
    if (rc) return rc;
    d->offsets_at = a.at;
    if (a.kind != K_ARRAY)
        return bad(r, "data_offsets at offset %llu is %s, not an array of 2 integers", a.at,
                   KIND_NAME[a.kind]);
    members m;
    if ((rc = open_members(r, &a, &m))) return rc;
    uint64_t v[2];
    unsigned n = 0;
    while ((rc = next_member(r, &m, &el)) == 1) {
        if (n == 2) return bad(r, "data_offsets at offset %llu has more than 2 entries", a.at);
        if ((rc = parse_u64(r, &el, "data_offsets entry", &v[n]))) return rc;
        n++;
    }
    if (rc) return rc;
    if (n != 2) return bad(r, "data_offsets at offset %llu has %u entries, want 2", a.at, n);
    if (v[1] < v[0])
        return bad(r, "data_offsets [%llu, %llu) at offset %llu end before they start",
                   (unsigned long long)v[0], (unsigned long long)v[1], a.at);
    d->start = v[0];
    d->end = v[1];
    return 0;
}

static int parse_descriptor(reader *r, descriptor *d, strbuf *scratch) {
    item dm, key, v;
    int rc = next_value(r, &dm);
    if (rc) return rc;
    memset(d, 0, sizeof *d);
    d->at = dm.at;
    if (dm.kind != K_MAP)
        return bad(r, "descriptor at offset %llu is %s, not a map", dm.at, KIND_NAME[dm.kind]);
    members m;
    if ((rc = open_members(r, &dm, &m))) return rc;
    while ((rc = next_member(r, &m, &key)) == 1) {
        const char *s = "";
        size_t n = 0;
        if (key.kind == K_TEXT) {
            if ((rc = string_bytes(r, &key, scratch, &s, &n))) return rc;
        } else if ((rc = value(r, &key, 4, NULL))) {
            return rc;
        }
        bool *seen = text_is(s, n, "dtype")          ? &d->has_dtype
                     : text_is(s, n, "shape")        ? &d->has_shape
                     : text_is(s, n, "data_offsets") ? &d->has_offsets
                     : text_is(s, n, "param_id")     ? &d->seen_param_id
                                                     : NULL;
        if (seen && *seen)
            return bad(r, "descriptor key \"%.*s\" at offset %llu appears twice", (int)n, s,
                       key.at);
        take_value(&m);
        if (seen == &d->has_dtype) {
            d->dtype_pos = r->pos;
            rc = parse_dtype(r, d, scratch);
        } else if (seen == &d->has_shape) {
            rc = parse_shape(r, d);
        } else if (seen == &d->has_offsets) {
            rc = parse_offsets(r, d);
        } else if ((rc = next_value(r, &v)) == 0) {
            /* param_id is Option<u64>: absent or null is None. Unknown keys are ignored, as
             * Burn's serde reader does. */
            if (!seen)
                rc = value(r, &v, 4, NULL);
            else if (v.kind != K_NULL && !(rc = parse_u64(r, &v, "param_id", &d->param_id)))
                d->has_param_id = true;
        }
        if (rc) return rc;
        if (seen) *seen = true;
    }
    if (rc) return rc;
    const char *missing = !d->has_dtype     ? "dtype"
                          : !d->has_shape   ? "shape"
                          : !d->has_offsets ? "data_offsets"
                                            : NULL;
    if (missing) return bad(r, "descriptor at offset %llu has no \"%s\" key", d->at, missing);
    return 0;
}

/* Where each tensor's bytes are, relative to the data section, for layout and overlap checks. */
typedef struct span {
    size_t tensor;
    uint64_t start, end;
    unsigned long long at;
} span;

typedef struct loader {
    reader r;
    ckpt_catalog *cat;
    uint32_t source;
    span *spans;
    size_t nspans, cap_spans;
    strbuf metadata, scalars, unknown; /* JSON of the non-tensor top-level keys */
    bool has_metadata, has_scalars, has_tensors;
    size_t nunknown;
    bool doc_overflow;
} loader;

static int add_tensor(loader *L, const char *name, size_t name_len, const descriptor *d,
                      strbuf *extra) {
    reader *r = &L->r;
    uint64_t shape[CKPT_MAX_DIMS];
    uint32_t ndim = d->ndim;
    memcpy(shape, d->shape, sizeof shape);
    uint64_t span_bytes = d->end - d->start;
    char text[200];
    if (d->quantized) {
        ndim = 1;
        shape[0] = span_bytes;
    } else {
        uint64_t numel = 0, nbytes = 0;
        bool fits = catalog_shape_nbytes(d->shape, d->ndim, d->dtype, &numel, &nbytes);
        if (!fits || nbytes != span_bytes) shape_text(text, sizeof text, d->shape, d->ndim);
        if (!fits)
            return bad(r, "shape %s at offset %llu overflows 64 bits (in bytes of %s)", text,
                       d->shape_at, ckpt_dtype_info_of(d->dtype)->name);
        if (nbytes != span_bytes)
            return bad(r,
                       "data_offsets [%llu, %llu) at offset %llu span %llu bytes but shape %s "
                       "of %s needs %llu",
                       (unsigned long long)d->start, (unsigned long long)d->end, d->offsets_at,
                       (unsigned long long)span_bytes, text, ckpt_dtype_info_of(d->dtype)->name,
                       (unsigned long long)nbytes);
    }
    /* Sidecar members: the dtype as Burn wrote it, its param_id, the logical shape of a
     * quantized tensor. */
    sb_clear(extra);
    sb_puts(extra, "\"burn_dtype\": ");
    int rc = render_at(r, d->dtype_pos, 4, DTYPE_JSON_LIMIT, extra);
    if (rc) return rc;
    if (r->overflow)
        return bad(r, "dtype at offset %llu renders to more than %d bytes of JSON", d->dtype_at,
                   DTYPE_JSON_LIMIT);
    if (d->has_param_id) {
        sb_puts(extra, ", \"param_id\": ");
        sb_u64(extra, d->param_id);
    }
    if (d->quantized) {
        sb_puts(extra, ", \"quantized\": true, \"burn_shape\": [");
        for (uint32_t i = 0; i < d->ndim; i++) {
            if (i) sb_puts(extra, ", ");
            sb_u64(extra, d->shape[i]);
        }
        sb_putc(extra, ']');
    }
    sb_putc(extra, '\0');
    if (extra->failed) return ckpt_fail(r->err, -ENOMEM, "out of memory");

    if (GROW(L->spans, L->cap_spans, L->nspans + 1))
        return ckpt_fail(r->err, -ENOMEM, "out of memory");
    size_t idx;
    rc = catalog_add_tensor(L->cat, name, name_len, d->dtype, ndim, shape, &idx, r->err);
    if (!rc) rc = catalog_set_extra(L->cat, idx, extra->data, r->err);
    if (rc) return rc;
    L->spans[L->nspans++] = (span){idx, d->start, d->end, d->offsets_at};
    return 0;
}

static int parse_tensors(loader *L, const item *map) {
    reader *r = &L->r;
    if (map->kind != K_MAP)
        return bad(r, "tensors at offset %llu is %s, not a map", map->at, KIND_NAME[map->kind]);
    if (!map->indefinite && map->u > MAX_TENSORS)
        return bad(r, "tensors count %llu at offset %llu exceeds Burn's limit of %d",
                   (unsigned long long)map->u, map->at, MAX_TENSORS);
    members m;
    int rc = open_members(r, map, &m);
    if (rc) return rc;
    strbuf name_buf, scratch, extra;
    sb_init(&name_buf);
    sb_init(&scratch);
    sb_init(&extra);
    item key;
    size_t count = 0;
    while ((rc = next_member(r, &m, &key)) == 1) {
        if (key.kind != K_TEXT) {
            rc = bad(r, "tensor name at offset %llu is %s, not a text string", key.at,
                     KIND_NAME[key.kind]);
            break;
        }
        if (++count > MAX_TENSORS) {
            rc = bad(r, "tensors map at offset %llu holds more than Burn's limit of %d tensors",
                     map->at, MAX_TENSORS);
            break;
        }
        const char *name;
        size_t name_len;
        if ((rc = string_bytes(r, &key, &name_buf, &name, &name_len))) break;
        take_value(&m);
        descriptor d;
        r->tensor = name;
        r->tensor_len = name_len;
        rc = parse_descriptor(r, &d, &scratch);
        if (!rc) rc = add_tensor(L, name, name_len, &d, &extra);
        r->tensor = NULL;
        if (rc) break;
    }
    sb_free(&name_buf);
    sb_free(&scratch);
    sb_free(&extra);
    return rc < 0 ? rc : 0;
}

/* "metadata" and "scalars": maps rendered as JSON for .ckptfs/metadata.json. Burn's schema says
 * text -> text and text -> {variant: number}; any CBOR value is accepted and converted. */
static int render_map(loader *L, const item *v, const char *field, strbuf *out) {
    reader *r = &L->r;
    if (v->kind != K_MAP)
        return bad(r, "%s at offset %llu is %s, not a map", field, v->at, KIND_NAME[v->kind]);
    r->json_limit = DOC_JSON_LIMIT;
    r->overflow = false;
    int rc = value(r, v, 2, out);
    if (r->overflow || out->len > DOC_JSON_LIMIT) L->doc_overflow = true;
    return rc;
}

static int parse_top(loader *L) {
    reader *r = &L->r;
    item top, key, v;
    int rc = next_value(r, &top);
    if (rc) return rc;
    if (top.kind != K_MAP)
        return bad(r, "metadata at offset %llu is %s, not a CBOR map", top.at, KIND_NAME[top.kind]);
    members m;
    if ((rc = open_members(r, &top, &m))) return rc;
    strbuf key_buf;
    sb_init(&key_buf);
    while ((rc = next_member(r, &m, &key)) == 1) {
        const char *s = "";
        size_t n = 0;
        if (key.kind == K_TEXT && (rc = string_bytes(r, &key, &key_buf, &s, &n))) break;
        bool *seen = key.kind != K_TEXT          ? NULL
                     : text_is(s, n, "tensors")  ? &L->has_tensors
                     : text_is(s, n, "metadata") ? &L->has_metadata
                     : text_is(s, n, "scalars")  ? &L->has_scalars
                                                 : NULL;
        if (seen && *seen) {
            rc = bad(r, "top-level key \"%.*s\" at offset %llu appears twice", (int)n, s, key.at);
            break;
        }
        if (!seen) {
            /* Unknown top-level keys are kept for metadata.json, under "unknown_keys". */
            strbuf *u = &L->unknown;
            if (L->nunknown++) sb_puts(u, ", ");
            r->json_limit = DOC_JSON_LIMIT;
            r->overflow = false;
            if (key.kind == K_TEXT) {
                sb_json_str(u, s, n);
            } else {
                strbuf kj;
                sb_init(&kj);
                rc = key_text(r, &key, 1, &kj);
                sb_json_str(u, kj.data ? kj.data : "", kj.len);
                sb_free(&kj);
                if (rc) break;
            }
            sb_puts(u, ": ");
            if ((rc = next_map_value(r, &m, &v)) || (rc = value(r, &v, 1, u))) break;
            if (r->overflow || u->len > DOC_JSON_LIMIT) L->doc_overflow = true;
            continue;
        }
        if ((rc = next_map_value(r, &m, &v))) break;
        if (seen == &L->has_tensors)
            rc = parse_tensors(L, &v);
        else if (seen == &L->has_metadata)
            rc = render_map(L, &v, "metadata", &L->metadata);
        else
            rc = render_map(L, &v, "scalars", &L->scalars);
        if (rc) break;
        *seen = true;
    }
    sb_free(&key_buf);
    if (rc < 0) return rc;
    if (!L->has_tensors) return bad(r, "metadata at offset %llu has no \"tensors\" key", top.at);
    return 0;
}

/* ---- the data section ---- */

static uint64_t align_up(uint64_t v) {
    return (v + DATA_ALIGN - 1) / DATA_ALIGN * DATA_ALIGN;
}

/* Both layouts say version 1 (see the top of this file). Returns true for the aligned one. */
static bool detect_layout(loader *L, uint64_t unaligned, uint64_t aligned, uint64_t max_end) {
    uint64_t size = L->cat->sources[L->source].size;
    if (unaligned == aligned) return true;
    for (size_t i = 0; i < L->nspans; i++)
        if (L->spans[i].start % DATA_ALIGN) return false;
    if (size >= aligned && size - aligned == max_end) return true;
    if (size >= unaligned && size - unaligned == max_end) return false;
    /* Undecided (trailing bytes, or a truncated file): the aligned layout pads with zeros. A
     * file cut short is read as aligned and then fails the bounds check, rather than being read
     * as unaligned with its bytes shifted. */
    unsigned char pad[DATA_ALIGN];
    uint64_t have =
        size < aligned ? (size > unaligned ? size - unaligned : 0) : aligned - unaligned;
    ckpt_err ignored;
    if (have &&
        ckpt_source_read(L->cat, L->source, unaligned, pad, (size_t)have, "padding", &ignored))
        return true;
    for (uint64_t i = 0; i < have; i++)
        if (pad[i]) return false;
    return true;
}

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->start != y->start) return (x->start > y->start) - (x->start < y->start);
    return (x->end > y->end) - (x->end < y->end);
}

static int place_tensors(loader *L, uint64_t data_start) {
    reader *r = &L->r;
    ckpt_catalog *cat = L->cat;
    uint64_t size = cat->sources[L->source].size;
    uint64_t room = size > data_start ? size - data_start : 0;
    for (size_t i = 0; i < L->nspans; i++) {
        const span *s = &L->spans[i];
        if (s->end > room) {
            const ckpt_tensor *t = &cat->tensors[s->tensor];
            return ckpt_fail(r->err, -EINVAL,
                             "%s: tensor \"%.*s\": data_offsets [%llu, %llu) at offset %llu run "
                             "past the end of the file (the data section at offset %llu holds "
                             "%llu bytes)",
                             r->path, SHOWN_NAME(t->name, t->name_len),
                             (unsigned long long)s->start, (unsigned long long)s->end,
                             (unsigned long long)s->at, (unsigned long long)data_start,
                             (unsigned long long)room);
        }
    }
    /* Burn writers never share bytes between tensors; overlapping extents mean a damaged or
     * forged file, and a round trip through ckptfs could not reproduce it. */
    span *sorted = malloc((L->nspans ? L->nspans : 1) * sizeof *sorted);
    if (!sorted) return ckpt_fail(r->err, -ENOMEM, "out of memory");
    if (L->nspans) memcpy(sorted, L->spans, L->nspans * sizeof *sorted);
    qsort(sorted, L->nspans, sizeof *sorted, span_cmp);
    const span *prev = NULL;
    for (size_t i = 0; i < L->nspans; i++) {
        const span *s = &sorted[i];
        if (s->start == s->end) continue;
        if (prev && s->start < prev->end) {
            span x = *s, y = *prev;
            free(sorted);
            const ckpt_tensor *a = &cat->tensors[x.tensor], *b = &cat->tensors[y.tensor];
            if (a->name_len == b->name_len && memcmp(a->name, b->name, a->name_len) == 0)
                return ckpt_fail(r->err, -EINVAL,
                                 "%s: tensor \"%.*s\": duplicate tensor name in the tensors map "
                                 "(data_offsets at offsets %llu and %llu)",
                                 r->path, SHOWN_NAME(a->name, a->name_len), y.at, x.at);
            return ckpt_fail(r->err, -EINVAL,
                             "%s: tensor \"%.*s\": data_offsets [%llu, %llu) at offset %llu "
                             "overlap those of tensor \"%.*s\" [%llu, %llu)",
                             r->path, SHOWN_NAME(a->name, a->name_len), (unsigned long long)x.start,
                             (unsigned long long)x.end, x.at, SHOWN_NAME(b->name, b->name_len),
                             (unsigned long long)y.start, (unsigned long long)y.end);
        }
        if (!prev || s->end > prev->end) prev = s;
    }
    free(sorted);
    for (size_t i = 0; i < L->nspans; i++) {
        const span *s = &L->spans[i];
        int rc = catalog_add_piece(cat, s->tensor, L->source, data_start + s->start, NULL, NULL,
                                   NULL, r->err);
        if (rc) return rc;
    }
    return 0;
}

static int add_doc(loader *L, unsigned version, uint32_t msize, bool aligned, uint64_t data_start) {
    strbuf doc;
    sb_init(&doc);
    sb_printf(&doc,
              "{\"version\": %u, \"metadata_size\": %u, \"layout\": \"%s\", \"data_start\": %llu, "
              "\"tensor_count\": %zu",
              version, msize, aligned ? "aligned" : "unaligned", (unsigned long long)data_start,
              L->nspans);
    if (L->doc_overflow) {
        sb_printf(&doc,
                  ", \"omitted\": \"metadata, scalars and unknown keys render to more than "
                  "%d bytes of JSON\"",
                  DOC_JSON_LIMIT);
    } else {
        if (L->has_metadata) {
            sb_puts(&doc, ", \"metadata\": ");
            sb_put(&doc, L->metadata.data, L->metadata.len);
        }
        if (L->has_scalars) {
            sb_puts(&doc, ", \"scalars\": ");
            sb_put(&doc, L->scalars.data, L->scalars.len);
        }
        if (L->nunknown) {
            sb_puts(&doc, ", \"unknown_keys\": {");
            sb_put(&doc, L->unknown.data, L->unknown.len);
            sb_putc(&doc, '}');
        }
    }
    sb_putc(&doc, '}');
    int rc = doc.failed ? ckpt_fail(L->r.err, -ENOMEM, "out of memory")
                        : catalog_add_doc(L->cat, "burnpack", doc.data, doc.len, L->r.err);
    sb_free(&doc);
    return rc;
}

static int load(ckpt_catalog *cat, uint32_t source, ckpt_err *err) {
    const ckpt_source *src = &cat->sources[source];
    if (src->size < HEADER_BYTES)
        return ckpt_fail(err, -EINVAL,
                         "%s: header: file is %llu bytes, too short for the 10-byte header "
                         "(magic, version, metadata_size) at offset 0",
                         src->path, (unsigned long long)src->size);
    unsigned char h[HEADER_BYTES];
    int rc = ckpt_source_read(cat, source, 0, h, sizeof h, "header", err);
    if (rc) return rc;
    if (memcmp(h, MAGIC, sizeof MAGIC) != 0)
        return ckpt_fail(err, -EINVAL,
                         "%s: magic %02x %02x %02x %02x at offset 0 is not \"NRUB\" (Burnpack)",
                         src->path, h[0], h[1], h[2], h[3]);
    unsigned version = le16(h + 4);
    if (version > 1)
        return ckpt_fail(err, -EINVAL,
                         "%s: version %u at offset 4 is newer than the Burnpack version 1 this "
                         "reader knows",
                         src->path, version);
    uint32_t msize = le32(h + 6);
    if (msize > METADATA_LIMIT)
        return ckpt_fail(err, -EINVAL,
                         "%s: metadata_size %u at offset 6 exceeds Burn's limit of %u bytes",
                         src->path, msize, METADATA_LIMIT);
    if (msize > src->size - HEADER_BYTES)
        return ckpt_fail(err, -EINVAL,
                         "%s: metadata_size %u at offset 6 runs past the end of the file "
                         "(size %llu)",
                         src->path, msize, (unsigned long long)src->size);
    if (msize == 0)
        return ckpt_fail(err, -EINVAL,
                         "%s: metadata_size 0 at offset 6 leaves no CBOR metadata (want at least "
                         "the \"tensors\" map)",
                         src->path);
    unsigned char *buf = malloc(msize);
    if (!buf) return ckpt_fail(err, -ENOMEM, "out of memory");
    rc = ckpt_source_read(cat, source, HEADER_BYTES, buf, msize, "metadata", err);
    if (rc) {
        free(buf);
        return rc;
    }
    loader L = {.cat = cat, .source = source};
    L.r = (reader){.buf = buf, .len = msize, .path = src->path, .err = err};
    sb_init(&L.metadata);
    sb_init(&L.scalars);
    sb_init(&L.unknown);
    rc = parse_top(&L);
    if (rc) goto out;
    if (L.r.pos < L.r.len)
        catalog_warn(cat, "%s: %zu bytes after the CBOR metadata at offset %llu are ignored",
                     src->path, L.r.len - L.r.pos, AT(L.r.pos));

    uint64_t unaligned = HEADER_BYTES + (uint64_t)msize, aligned = align_up(unaligned);
    uint64_t max_end = 0;
    for (size_t i = 0; i < L.nspans; i++)
        if (L.spans[i].end > max_end) max_end = L.spans[i].end;
    bool is_aligned = detect_layout(&L, unaligned, aligned, max_end);
    uint64_t data_start = is_aligned ? aligned : unaligned;
    if ((rc = place_tensors(&L, data_start))) goto out;
    if (src->size > data_start && src->size - data_start > max_end)
        catalog_warn(cat, "%s: %llu bytes after the last tensor (offset %llu) are ignored",
                     src->path, (unsigned long long)(src->size - data_start - max_end),
                     (unsigned long long)(data_start + max_end));
    if (L.doc_overflow)
        catalog_warn(cat, "%s: metadata too large to show in metadata.json", src->path);
    rc = add_doc(&L, version, msize, is_aligned, data_start);
out:
    if (!rc && (L.metadata.failed || L.scalars.failed || L.unknown.failed))
        rc = ckpt_fail(err, -ENOMEM, "out of memory");
    sb_free(&L.metadata);
    sb_free(&L.scalars);
    sb_free(&L.unknown);
    free(L.spans);
    free(buf);
    return rc;
}

const ckpt_format format_burnpack = {
    .name = "burnpack", .label = "Burnpack", .probe = probe, .load = load};
