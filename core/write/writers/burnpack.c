/* burnpack writer: a catalog as Burn's .bpk container, in the current (aligned) layout, so that
 * the output is byte for byte what Burn >= 0.20.0-pre.5 writes for the same tensors (format
 * notes, Burnpack 2.7):
 *
 *   "NRUB" | version 1 (u16 LE) | M (u32 LE) | M bytes of CBOR | zeros up to align(10 + M, 256)
 *   | tensors in data order, each starting at align(previous end, 256) of the data section,
 *     zero gaps between them, nothing after the last one.
 *
 * The CBOR is what ciborium makes of Burn's serde structs: a map {"tensors", ["metadata"],
 * ["scalars"]}, tensors keyed by name in bytewise order, each descriptor {dtype, shape,
 * data_offsets, [param_id]} in that order, definite lengths, shortest integer heads, floats in
 * the narrowest IEEE width that holds the value exactly, no tags. It is encoded with libcbor's
 * streaming encoders (cbor_encode_uint, cbor_encode_map_start, ...): they give exactly those
 * bytes and allocate nothing, whereas libcbor's item trees cost a node per item and serialize
 * whatever width the builder was told. Floats are written by hand: the width choice is ciborium's
 * rule, not libcbor's, and libcbor 0.8's cbor_encode_half rounds subnormal halves (3 x 2^-24
 * comes out as 2 x 2^-24).
 *
 * What goes in:
 *  - Only the model's tensors (aside ones are per-rank copies or optimizer state). Every one must
 *    be complete and of a dtype Burn has: F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16 U8 and
 *    BOOL, written as {"Bool": "Native"} (one byte per element, Burn's own bool). That is the
 *    map form of burn >= 0.21.0-pre.3, which current Burn requires; older Burn wanted the text
 *    "Bool" (notes 2.3, 2.9). Complex, 8/6/4-bit floats and ggml blocks are refused, naming the
 *    tensor, rather than dropped or reinterpreted.
 *  - Data order: the order the bytes have in their sources (source file, then offset). For a
 *    Burnpack source that is Burn's own data order, which the sorted descriptor map does not
 *    record, and which byte identity needs; for other sources it keeps reads sequential.
 *  - From a Burnpack source (the decoder's sidecar members): the dtype as Burn wrote it
 *    ("Flex32", a text "Bool", {"Bool": "U32"}, a QFloat scheme with its logical shape) when it
 *    still agrees with the catalog's dtype, and the param_id. Other sources get no param_id:
 *    it is an Option that Burn fills with fresh ids when absent (notes 2.2, 2.7 step 4), and an
 *    invented id would claim an identity the tensor never had.
 *  - Metadata: a Burnpack source's "metadata" and "scalars" as they were (no key is added, so a
 *    round trip is exact); any other source gets BurnpackStore's default keys (format, producer,
 *    version), naming ckptfs as the producer. Burn reads metadata as text -> text, so a value
 *    that is not text (only non-Burn writers make those) is written as its JSON text; a scalar
 *    that is not one of Burn's {Int | UInt | Float | Bool} is refused.
 *  - Burn's reader limits are writer limits here too (100 000 tensors, 100 MiB of CBOR, 10 GiB
 *    per tensor, 100 GiB per file): a file Burn refuses to open is no conversion. */
#include "writers.h"

#include "../../model/catalog.h"
#include "../../util/json.h"
#include "../../util/strbuf.h"
#include "../../util/utf8.h"

#include <cbor.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { HEADER_BYTES = 10, DATA_ALIGN = 256, MAX_TENSORS = 100000 };
#define METADATA_LIMIT 104857600ull /* Burn: MAX_METADATA_SIZE */
#define TENSOR_LIMIT (10ull << 30)  /* Burn: MAX_TENSOR_SIZE on 64-bit targets */
#define FILE_LIMIT (100ull << 30)   /* Burn: MAX_FILE_SIZE */

/* ---- CBOR items, as ciborium writes them ---- */

typedef size_t (*head_encoder)(size_t, unsigned char *, size_t);

static void cb_head(strbuf *sb, head_encoder enc, size_t n) {
    unsigned char b[9];
    sb_put(sb, b, enc(n, b, sizeof b));
}

static void cb_uint(strbuf *sb, uint64_t v) {
    unsigned char b[9];
    sb_put(sb, b, cbor_encode_uint(v, b, sizeof b));
}

/* The CBOR negative integer -1 - v. */
static void cb_negint(strbuf *sb, uint64_t v) {
    unsigned char b[9];
    sb_put(sb, b, cbor_encode_negint(v, b, sizeof b));
}

static void cb_text(strbuf *sb, const char *s, size_t n) {
    cb_head(sb, cbor_encode_string_start, n);
    sb_put(sb, s, n);
}

static void cb_str(strbuf *sb, const char *s) {
    cb_text(sb, s, strlen(s));
}

static void cb_simple(strbuf *sb, unsigned char v) {
    sb_putc(sb, (char)v);
}

/* The half-precision bits of d, when a half holds d exactly. */
static bool half_of(double d, uint16_t *out) {
    uint16_t sign = signbit(d) ? 0x8000 : 0;
    if (isnan(d)) {
        *out = 0x7e00; /* ciborium writes every NaN as the quiet half NaN */
        return true;
    }
    if (isinf(d)) {
        *out = sign | 0x7c00;
        return true;
    }
    double a = fabs(d);
    if (a == 0) {
        *out = sign;
        return true;
    }
    int e;
    double m = frexp(a, &e); /* a = m * 2^e, m in [0.5, 1) */
    int exp = e - 1;         /* a = (2m) * 2^exp, 2m in [1, 2) */
    if (exp > 15) return false;
    if (exp >= -14) {
        double frac = (2 * m - 1) * 1024;
        if (frac != floor(frac)) return false;
        *out = sign | (uint16_t)((exp + 15) << 10) | (uint16_t)frac;
        return true;
    }
    double sub = ldexp(a, 24); /* subnormal: a = sub * 2^-24, sub in 1..1023 */
    if (sub != floor(sub) || sub > 1023) return false;
    *out = sign | (uint16_t)sub;
    return true;
}

static void cb_float(strbuf *sb, double d) {
    unsigned char b[9];
    uint16_t h;
    if (half_of(d, &h)) {
        b[0] = 0xf9;
        b[1] = (unsigned char)(h >> 8);
        b[2] = (unsigned char)h;
        sb_put(sb, b, 3);
        return;
    }
    if (fabs(d) <= FLT_MAX && (double)(float)d == d) {
        float f = (float)d;
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        b[0] = 0xfa;
        for (int i = 0; i < 4; i++) b[1 + i] = (unsigned char)(u >> (24 - 8 * i));
        sb_put(sb, b, 5);
        return;
    }
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    b[0] = 0xfb;
    for (int i = 0; i < 8; i++) b[1 + i] = (unsigned char)(u >> (56 - 8 * i));
    sb_put(sb, b, 9);
}

/* ---- JSON (the decoder's sidecar members and metadata document) back to CBOR ---- */

static bool is_integer_text(const json_value *v) {
    return v->type == JSON_NUMBER && !memchr(v->str, '.', v->len) && !memchr(v->str, 'e', v->len) &&
           !memchr(v->str, 'E', v->len);
}

/* Digits to u64; false when they do not fit. */
static bool digits_u64(const char *s, size_t n, uint64_t *out) {
    uint64_t r = 0;
    if (n == 0) return false;
    for (size_t i = 0; i < n; i++) {
        unsigned d = (unsigned)(s[i] - '0');
        if (d > 9 || r > (UINT64_MAX - d) / 10) return false;
        r = r * 10 + d;
    }
    *out = r;
    return true;
}

/* A JSON integer as a CBOR integer (uint, or negint down to -2^64). False when out of range. */
static bool cb_json_int(strbuf *sb, const json_value *v) {
    uint64_t mag;
    if (v->len && v->str[0] == '-') {
        if (v->len - 1 == 20 && memcmp(v->str + 1, "18446744073709551616", 20) == 0) {
            cb_negint(sb, UINT64_MAX);
            return true;
        }
        if (!digits_u64(v->str + 1, v->len - 1, &mag)) return false;
        if (mag == 0)
            cb_uint(sb, 0);
        else
            cb_negint(sb, mag - 1);
        return true;
    }
    if (!digits_u64(v->str, v->len, &mag)) return false;
    cb_uint(sb, mag);
    return true;
}

static double json_number(const json_value *v) {
    char buf[64];
    if (v->len >= sizeof buf) return strtod(v->str, NULL); /* JSON text ends at a delimiter */
    memcpy(buf, v->str, v->len);
    buf[v->len] = '\0';
    return strtod(buf, NULL);
}

/* Any JSON value as the CBOR it was rendered from: objects keep their member order (the
 * decoder rendered CBOR maps in file order), integers stay integers, other numbers become the
 * narrowest exact float. */
static void cb_json(strbuf *sb, const json_value *v) {
    switch (v->type) {
    case JSON_NULL:
        cb_simple(sb, 0xf6);
        return;
    case JSON_FALSE:
        cb_simple(sb, 0xf4);
        return;
    case JSON_TRUE:
        cb_simple(sb, 0xf5);
        return;
    case JSON_NUMBER:
        if (!is_integer_text(v) || !cb_json_int(sb, v)) cb_float(sb, json_number(v));
        return;
    case JSON_STRING:
        cb_text(sb, v->str, v->len);
        return;
    case JSON_ARRAY:
        cb_head(sb, cbor_encode_array_start, v->count);
        for (const json_value *m = v->head; m; m = m->next) cb_json(sb, m);
        return;
    case JSON_OBJECT:
        cb_head(sb, cbor_encode_map_start, v->count);
        for (const json_value *m = v->head; m; m = m->next) {
            cb_text(sb, m->key, m->key_len);
            cb_json(sb, m);
        }
        return;
    }
}

/* Compact JSON text of a value (a metadata value Burn could only read as a string). */
static void json_text(strbuf *sb, const json_value *v) {
    switch (v->type) {
    case JSON_NULL:
        sb_puts(sb, "null");
        return;
    case JSON_FALSE:
        sb_puts(sb, "false");
        return;
    case JSON_TRUE:
        sb_puts(sb, "true");
        return;
    case JSON_NUMBER:
        sb_put(sb, v->str, v->len);
        return;
    case JSON_STRING:
        sb_json_str(sb, v->str, v->len);
        return;
    case JSON_ARRAY:
    case JSON_OBJECT:
        sb_putc(sb, v->type == JSON_ARRAY ? '[' : '{');
        for (const json_value *m = v->head; m; m = m->next) {
            if (m != v->head) sb_putc(sb, ',');
            if (v->type == JSON_OBJECT) {
                sb_json_str(sb, m->key, m->key_len);
                sb_putc(sb, ':');
            }
            json_text(sb, m);
        }
        sb_putc(sb, v->type == JSON_ARRAY ? ']' : '}');
        return;
    }
}

/* ---- the tensors ---- */

typedef struct entry {
    const ckpt_tensor *t;
    size_t index;    /* in the catalog */
    uint32_t source; /* where its bytes come from: the data order */
    uint64_t file_offset;
    size_t dtype_at, dtype_len, shape_at, shape_len; /* encoded values in job.pool */
    bool has_param_id;
    uint64_t param_id;
    uint64_t start, end; /* data_offsets */
} entry;

typedef struct job {
    out_file *f;
    const ckpt_catalog *cat;
    ckpt_err *err;
    bool from_burnpack;
    entry *e;
    size_t n;
    strbuf pool; /* the dtype and shape values of every descriptor */
    strbuf meta; /* the encoded "metadata" map, meta_count entries */
    strbuf scalars;
    size_t meta_count, scalar_count;
    json_doc doc; /* the source's "burnpack" metadata document */
    bool have_doc;
} job;

/* The name for a one-line message: control bytes shown as \xNN. */
static const char *shown(const ckpt_tensor *t, char *buf, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < t->name_len && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)t->name[i];
        if (c < 0x20 || c == 0x7f)
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
        else
            buf[o++] = (char)c;
    }
    buf[o] = '\0';
    return buf;
}

static int tensor_fail(job *J, const ckpt_tensor *t, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int tensor_fail(job *J, const ckpt_tensor *t, int code, const char *fmt, ...) {
    char name[200], msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ckpt_fail(J->err, code, "%s: tensor \"%s\" %s", J->f->final_path,
                     shown(t, name, sizeof name), msg);
}

/* Burn's unit dtype for a ckptfs dtype; NULL when Burn has none (BOOL is a map, see above). */
static const char *burn_unit_name(ckpt_dtype dt) {
    switch (dt) {
    case CKPT_F64:
        return "F64";
    case CKPT_F32:
        return "F32";
    case CKPT_F16:
        return "F16";
    case CKPT_BF16:
        return "BF16";
    case CKPT_I64:
        return "I64";
    case CKPT_I32:
        return "I32";
    case CKPT_I16:
        return "I16";
    case CKPT_I8:
        return "I8";
    case CKPT_U64:
        return "U64";
    case CKPT_U32:
        return "U32";
    case CKPT_U16:
        return "U16";
    case CKPT_U8:
        return "U8";
    default:
        return NULL;
    }
}

/* The ckptfs dtype a Burn dtype value (as the decoder rendered it) stands for; false for QFloat
 * and anything unknown. */
static bool burn_dtype_layout(const json_value *v, ckpt_dtype *out) {
    static const struct {
        const char *name;
        ckpt_dtype dt;
    } units[] = {{"F64", CKPT_F64},   {"F32", CKPT_F32},  {"Flex32", CKPT_F32}, {"F16", CKPT_F16},
                 {"BF16", CKPT_BF16}, {"I64", CKPT_I64},  {"I32", CKPT_I32},    {"I16", CKPT_I16},
                 {"I8", CKPT_I8},     {"U64", CKPT_U64},  {"U32", CKPT_U32},    {"U16", CKPT_U16},
                 {"U8", CKPT_U8},     {"Bool", CKPT_BOOL}};
    if (v->type == JSON_STRING) {
        for (size_t i = 0; i < sizeof units / sizeof *units; i++)
            if (json_str_eq(v, units[i].name)) {
                *out = units[i].dt;
                return true;
            }
        return false;
    }
    const json_value *store = json_member(v, "Bool");
    if (!store || v->count != 1) return false;
    if (json_str_eq(store, "Native") || json_str_eq(store, "U8")) {
        *out = CKPT_BOOL;
        return true;
    }
    if (json_str_eq(store, "U32")) {
        *out = CKPT_U32;
        return true;
    }
    return false;
}

static void encode_shape(strbuf *sb, const uint64_t *shape, uint32_t ndim) {
    cb_head(sb, cbor_encode_array_start, ndim);
    for (uint32_t d = 0; d < ndim; d++) cb_uint(sb, shape[d]);
}

/* A quantized tensor's logical shape, from the sidecar's "burn_shape". */
static bool burn_shape_of(const json_value *v, uint64_t *shape, uint32_t *ndim) {
    if (!v || v->type != JSON_ARRAY || v->count > CKPT_MAX_DIMS) return false;
    uint32_t n = 0;
    for (const json_value *m = v->head; m; m = m->next)
        if (!json_as_u64(m, &shape[n++])) return false;
    *ndim = n;
    return true;
}

/* What a Burnpack source said about the tensor: its dtype as Burn wrote it (kept when it still
 * describes the catalog's bytes) and its param_id. Returns 1 when the dtype was taken. */
static int from_burnpack_extra(job *J, entry *e) {
    const ckpt_tensor *t = e->t;
    if (!t->extra) return 0;
    strbuf wrapped;
    sb_init(&wrapped);
    sb_putc(&wrapped, '{');
    ckpt_tensor_extra(t, &wrapped);
    sb_putc(&wrapped, '}');
    if (wrapped.failed) return ckpt_fail(J->err, -ENOMEM, "out of memory");
    json_doc doc;
    json_error jerr;
    int rc = json_parse(&doc, wrapped.data, wrapped.len, &jerr);
    if (rc) {
        sb_free(&wrapped);
        if (rc == -ENOMEM) return ckpt_fail(J->err, rc, "out of memory");
        /* The catalog's own output: unreadable means nothing to keep, not a broken source. */
        return 0;
    }
    int taken = 0;
    uint64_t pid;
    const json_value *p = json_member(doc.root, "param_id");
    if (p && json_as_u64(p, &pid)) {
        e->has_param_id = true;
        e->param_id = pid;
    }
    const json_value *bd = json_member(doc.root, "burn_dtype");
    const json_value *q = json_member(doc.root, "quantized");
    ckpt_dtype layout;
    uint64_t shape[CKPT_MAX_DIMS];
    uint32_t ndim;
    if (bd && q && q->type == JSON_TRUE && bd->type == JSON_OBJECT && bd->count == 1 &&
        json_member(bd, "QFloat") && t->dtype == CKPT_U8 && t->ndim == 1 &&
        burn_shape_of(json_member(doc.root, "burn_shape"), shape, &ndim)) {
        /* QFloat bytes are packed values plus scales: opaque here, exact on the way back. */
        e->dtype_at = J->pool.len;
        cb_json(&J->pool, bd);
        e->dtype_len = J->pool.len - e->dtype_at;
        e->shape_at = J->pool.len;
        encode_shape(&J->pool, shape, ndim);
        e->shape_len = J->pool.len - e->shape_at;
        taken = 1;
    } else if (bd && !(q && q->type == JSON_TRUE) && burn_dtype_layout(bd, &layout) &&
               layout == t->dtype) {
        e->dtype_at = J->pool.len;
        cb_json(&J->pool, bd);
        e->dtype_len = J->pool.len - e->dtype_at;
        taken = 1;
    }
    json_doc_free(&doc);
    sb_free(&wrapped);
    return taken;
}

static int describe_tensor(job *J, entry *e) {
    const ckpt_tensor *t = e->t;
    bool utf8_ok = true;
    for (size_t i = 0; i < t->name_len && utf8_ok;) {
        size_t k = utf8_seq_len((const unsigned char *)t->name + i, t->name_len - i);
        utf8_ok = k > 0;
        i += k ? k : 1;
    }
    if (!utf8_ok)
        return tensor_fail(J, t, -EINVAL,
                           "has a name that is not valid UTF-8, which a Burnpack name (a CBOR "
                           "text string) cannot hold");
    if (t->incomplete)
        return tensor_fail(J, t, -EIO, "is incomplete (part of it is stored nowhere)");
    if (t->nbytes > TENSOR_LIMIT)
        return tensor_fail(J, t, -EFBIG,
                           "is %llu bytes, more than the 10 GiB per tensor Burn's reader accepts",
                           (unsigned long long)t->nbytes);
    e->dtype_len = e->shape_len = 0;
    int taken = J->from_burnpack ? from_burnpack_extra(J, e) : 0;
    if (taken < 0) return taken;
    if (!taken) {
        const char *unit = burn_unit_name(t->dtype);
        if (!unit && t->dtype != CKPT_BOOL)
            return tensor_fail(J, t, -EINVAL,
                               "is %s, which Burnpack cannot hold (Burn has no such dtype)",
                               ckpt_dtype_info_of(t->dtype)->name);
        e->dtype_at = J->pool.len;
        if (unit) {
            cb_str(&J->pool, unit);
        } else {
            cb_head(&J->pool, cbor_encode_map_start, 1);
            cb_str(&J->pool, "Bool");
            cb_str(&J->pool, "Native");
        }
        e->dtype_len = J->pool.len - e->dtype_at;
    }
    if (!e->shape_len) {
        e->shape_at = J->pool.len;
        encode_shape(&J->pool, t->shape, t->ndim);
        e->shape_len = J->pool.len - e->shape_at;
    }
    return J->pool.failed ? ckpt_fail(J->err, -ENOMEM, "out of memory") : 0;
}

static int by_data_order(const void *a, const void *b) {
    const entry *x = a, *y = b;
    if (x->source != y->source) return x->source < y->source ? -1 : 1;
    if (x->file_offset != y->file_offset) return x->file_offset < y->file_offset ? -1 : 1;
    /* an empty tensor at the same place came first: a later one would start past its bytes */
    if (x->t->nbytes != y->t->nbytes) return x->t->nbytes < y->t->nbytes ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

static int bytes_cmp(const char *a, size_t an, const char *b, size_t bn) {
    int c = memcmp(a, b, an < bn ? an : bn);
    if (c) return c;
    return (an > bn) - (an < bn);
}

/* Rust's String order, which is the BTreeMap's: bytewise. */
static int by_name(const void *a, const void *b) {
    const entry *const *x = a, *const *y = b;
    return bytes_cmp((*x)->t->name, (*x)->t->name_len, (*y)->t->name, (*y)->t->name_len);
}

static int collect(job *J) {
    const ckpt_catalog *cat = J->cat;
    size_t n = 0;
    for (size_t i = 0; i < cat->ntensors; i++)
        if (!cat->tensors[i].aside) n++;
    if (n > MAX_TENSORS)
        return ckpt_fail(J->err, -EINVAL, "%s: %zu tensors, more than the %d Burn's reader accepts",
                         J->f->final_path, n, MAX_TENSORS);
    J->e = calloc(n ? n : 1, sizeof *J->e);
    if (!J->e) return ckpt_fail(J->err, -ENOMEM, "out of memory");
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        if (t->aside) continue;
        entry *e = &J->e[J->n++];
        e->t = t;
        e->index = i;
        e->source = t->npieces ? t->pieces[0].source : UINT32_MAX;
        e->file_offset = t->npieces ? t->pieces[0].file_offset : 0;
        int rc = describe_tensor(J, e);
        if (rc) return rc;
    }
    return 0;
}

static uint64_t align_up(uint64_t v) {
    return (v + DATA_ALIGN - 1) / DATA_ALIGN * DATA_ALIGN;
}

/* Data offsets in data order; *data_bytes is the data section's size. */
static int place(job *J, uint64_t *data_bytes) {
    if (J->n > 1) qsort(J->e, J->n, sizeof *J->e, by_data_order);
    uint64_t end = 0;
    for (size_t i = 0; i < J->n; i++) {
        entry *e = &J->e[i];
        e->start = align_up(end);
        e->end = e->start + e->t->nbytes;
        end = e->end;
        if (end > FILE_LIMIT)
            return ckpt_fail(J->err, -EFBIG,
                             "%s: the tensors take more than the 100 GiB per file Burn's reader "
                             "accepts",
                             J->f->final_path);
    }
    *data_bytes = end;
    return 0;
}

/* ---- metadata and scalars ---- */

static int by_key(const void *a, const void *b) {
    const json_value *const *x = a, *const *y = b;
    return bytes_cmp((*x)->key, (*x)->key_len, (*y)->key, (*y)->key_len);
}

/* The members of a JSON object, sorted by key as a BTreeMap<String, _> serializes them. */
static const json_value **sorted_members(const json_value *obj) {
    const json_value **m = malloc((obj->count ? obj->count : 1) * sizeof *m);
    if (!m) return NULL;
    size_t n = 0;
    for (const json_value *v = obj->head; v; v = v->next) m[n++] = v;
    if (n > 1) qsort(m, n, sizeof *m, by_key);
    return m;
}

static int encode_metadata(job *J, const json_value *md) {
    if (md->type != JSON_OBJECT)
        return ckpt_fail(J->err, -EINVAL, "%s: the source's Burnpack metadata is %s, not a map",
                         J->f->final_path, json_type_desc(md->type));
    const json_value **m = sorted_members(md);
    if (!m) return ckpt_fail(J->err, -ENOMEM, "out of memory");
    strbuf text;
    sb_init(&text);
    for (size_t i = 0; i < md->count; i++) {
        cb_text(&J->meta, m[i]->key, m[i]->key_len);
        if (m[i]->type == JSON_STRING) {
            cb_text(&J->meta, m[i]->str, m[i]->len);
        } else {
            sb_clear(&text);
            json_text(&text, m[i]);
            cb_text(&J->meta, text.data ? text.data : "", text.len);
        }
    }
    J->meta_count = md->count;
    int rc = text.failed ? ckpt_fail(J->err, -ENOMEM, "out of memory") : 0;
    sb_free(&text);
    free(m);
    return rc;
}

/* One Burn Scalar: {"Int": i64} | {"UInt": u64} | {"Float": f64} | {"Bool": bool}. */
static bool encode_scalar(strbuf *sb, const json_value *v) {
    if (v->type != JSON_OBJECT || v->count != 1) return false;
    const json_value *x = v->head;
    uint64_t u;
    strbuf tmp;
    sb_init(&tmp);
    bool ok = false;
    if (x->key_len == 3 && memcmp(x->key, "Int", 3) == 0) {
        /* i64: up to 2^63 - 1, down to -2^63 */
        if (is_integer_text(x) && cb_json_int(&tmp, x)) {
            if (x->str[0] == '-')
                ok = digits_u64(x->str + 1, x->len - 1, &u) && u <= (1ull << 63);
            else
                ok = json_as_u64(x, &u) && u < (1ull << 63);
        }
    } else if (x->key_len == 4 && memcmp(x->key, "UInt", 4) == 0) {
        ok = json_as_u64(x, &u) && cb_json_int(&tmp, x);
    } else if (x->key_len == 5 && memcmp(x->key, "Float", 5) == 0) {
        /* the decoder shows NaN and the infinities as strings */
        ok = true;
        if (x->type == JSON_NUMBER)
            cb_float(&tmp, json_number(x));
        else if (json_str_eq(x, "NaN"))
            cb_float(&tmp, NAN);
        else if (json_str_eq(x, "Infinity"))
            cb_float(&tmp, INFINITY);
        else if (json_str_eq(x, "-Infinity"))
            cb_float(&tmp, -INFINITY);
        else
            ok = false;
    } else if (x->key_len == 4 && memcmp(x->key, "Bool", 4) == 0) {
        ok = x->type == JSON_TRUE || x->type == JSON_FALSE;
        cb_simple(&tmp, x->type == JSON_TRUE ? 0xf5 : 0xf4);
    }
    if (ok) {
        cb_head(sb, cbor_encode_map_start, 1);
        cb_text(sb, x->key, x->key_len);
        sb_put(sb, tmp.data, tmp.len);
    }
    sb_free(&tmp);
    return ok;
}

static int encode_scalars(job *J, const json_value *sc) {
    if (sc->type != JSON_OBJECT)
        return ckpt_fail(J->err, -EINVAL, "%s: the source's Burnpack scalars are %s, not a map",
                         J->f->final_path, json_type_desc(sc->type));
    const json_value **m = sorted_members(sc);
    if (!m) return ckpt_fail(J->err, -ENOMEM, "out of memory");
    int rc = 0;
    for (size_t i = 0; i < sc->count && !rc; i++) {
        cb_text(&J->scalars, m[i]->key, m[i]->key_len);
        if (!encode_scalar(&J->scalars, m[i]))
            rc = ckpt_fail(J->err, -EINVAL,
                           "%s: the source's Burnpack scalar \"%.*s\" is not one of Burn's "
                           "Int, UInt, Float or Bool scalars",
                           J->f->final_path, SHOWN_NAME(m[i]->key, m[i]->key_len));
    }
    J->scalar_count = sc->count;
    free(m);
    return rc;
}

static const ckpt_doc *find_doc(const ckpt_catalog *cat, const char *key) {
    for (size_t i = 0; i < cat->ndocs; i++)
        if (strcmp(cat->docs[i].key, key) == 0) return &cat->docs[i];
    return NULL;
}

static int build_metadata(job *J) {
    const ckpt_doc *d = J->from_burnpack ? find_doc(J->cat, "burnpack") : NULL;
    if (!d) {
        if (J->from_burnpack) return 0;
        /* BurnpackStore's default keys, with the producer that actually wrote the file. */
        cb_str(&J->meta, "format");
        cb_str(&J->meta, "burnpack");
        cb_str(&J->meta, "producer");
        cb_str(&J->meta, "ckptfs");
        cb_str(&J->meta, "version");
        cb_str(&J->meta, ckpt_version());
        J->meta_count = 3;
        return 0;
    }
    json_error jerr;
    int rc = json_parse(&J->doc, d->json, d->len, &jerr);
    if (rc)
        return ckpt_fail(J->err, rc, "%s: the source's Burnpack metadata document: %s",
                         J->f->final_path, jerr.msg);
    J->have_doc = true;
    const json_value *root = J->doc.root;
    if (json_member(root, "omitted"))
        return ckpt_fail(J->err, -EFBIG,
                         "%s: the source's Burnpack metadata and scalars are too large for "
                         "ckptfs to carry over",
                         J->f->final_path);
    const json_value *md = json_member(root, "metadata");
    const json_value *sc = json_member(root, "scalars");
    if (md && (rc = encode_metadata(J, md))) return rc;
    if (sc && (rc = encode_scalars(J, sc))) return rc;
    return 0;
}

/* ---- the file ---- */

static void build_cbor(job *J, strbuf *out) {
    size_t top = 1 + (J->meta_count > 0) + (J->scalar_count > 0);
    cb_head(out, cbor_encode_map_start, top);
    cb_str(out, "tensors");
    cb_head(out, cbor_encode_map_start, J->n);
    const entry **order = malloc((J->n ? J->n : 1) * sizeof *order);
    if (!order) {
        out->failed = true;
        return;
    }
    for (size_t i = 0; i < J->n; i++) order[i] = &J->e[i];
    if (J->n > 1) qsort(order, J->n, sizeof *order, by_name);
    for (size_t i = 0; i < J->n; i++) {
        const entry *e = order[i];
        cb_text(out, e->t->name, e->t->name_len);
        cb_head(out, cbor_encode_map_start, e->has_param_id ? 4 : 3);
        cb_str(out, "dtype");
        sb_put(out, J->pool.data + e->dtype_at, e->dtype_len);
        cb_str(out, "shape");
        sb_put(out, J->pool.data + e->shape_at, e->shape_len);
        cb_str(out, "data_offsets");
        cb_head(out, cbor_encode_array_start, 2);
        cb_uint(out, e->start);
        cb_uint(out, e->end);
        if (e->has_param_id) {
            cb_str(out, "param_id");
            cb_uint(out, e->param_id);
        }
    }
    free(order);
    if (J->meta_count) {
        cb_str(out, "metadata");
        cb_head(out, cbor_encode_map_start, J->meta_count);
        sb_put(out, J->meta.data, J->meta.len);
    }
    if (J->scalar_count) {
        cb_str(out, "scalars");
        cb_head(out, cbor_encode_map_start, J->scalar_count);
        sb_put(out, J->scalars.data, J->scalars.len);
    }
}

/* Two tensors of one name (under different prefixes) would be one key of the tensors map. */
static int check_unique_names(job *J) {
    const entry **order = malloc((J->n ? J->n : 1) * sizeof *order);
    if (!order) return ckpt_fail(J->err, -ENOMEM, "out of memory");
    for (size_t i = 0; i < J->n; i++) order[i] = &J->e[i];
    if (J->n > 1) qsort(order, J->n, sizeof *order, by_name);
    int rc = 0;
    for (size_t i = 1; i < J->n && !rc; i++)
        if (by_name(&order[i - 1], &order[i]) == 0)
            rc = tensor_fail(J, order[i]->t, -EINVAL,
                             "appears twice (under different prefixes); a Burnpack file holds "
                             "each name once");
    free(order);
    return rc;
}

static int write_file(job *J, uint64_t data_bytes) {
    out_file *f = J->f;
    strbuf cbor;
    sb_init(&cbor);
    build_cbor(J, &cbor);
    if (cbor.failed) {
        sb_free(&cbor);
        return ckpt_fail(J->err, -ENOMEM, "out of memory");
    }
    if (cbor.len > METADATA_LIMIT) {
        size_t len = cbor.len;
        sb_free(&cbor);
        return ckpt_fail(J->err, -EFBIG,
                         "%s: the CBOR metadata takes %zu bytes, more than the 100 MiB Burn's "
                         "reader accepts",
                         f->final_path, len);
    }
    uint64_t data_start = align_up(HEADER_BYTES + (uint64_t)cbor.len);
    if (data_start + data_bytes > FILE_LIMIT) {
        sb_free(&cbor);
        return ckpt_fail(J->err, -EFBIG,
                         "%s: the file would be more than the 100 GiB Burn's reader accepts",
                         f->final_path);
    }
    uint32_t m = (uint32_t)cbor.len;
    unsigned char head[HEADER_BYTES] = {'N',
                                        'R',
                                        'U',
                                        'B',
                                        1,
                                        0,
                                        (unsigned char)m,
                                        (unsigned char)(m >> 8),
                                        (unsigned char)(m >> 16),
                                        (unsigned char)(m >> 24)};
    out_bytes(f, head, sizeof head);
    out_bytes(f, cbor.data, cbor.len);
    sb_free(&cbor);
    out_zeros(f, (size_t)(data_start - HEADER_BYTES - m));
    /* J->e is in data order now */
    for (size_t i = 0; i < J->n && !f->failed; i++) {
        const entry *e = &J->e[i];
        uint64_t at = f->written;
        out_zeros(f, (size_t)(data_start + e->start - at));
        at = f->written;
        out_tensor(f, J->cat, e->t);
        if (!f->failed && f->written - at != e->t->nbytes)
            return tensor_fail(J, e->t, -EIO, "gave %llu of its %llu bytes",
                               (unsigned long long)(f->written - at),
                               (unsigned long long)e->t->nbytes);
    }
    return f->failed;
}

static int write_burnpack(out_file *f, const ckpt_catalog *cat, ckpt_err *err) {
    job J = {.f = f, .cat = cat, .err = err};
    J.from_burnpack = cat->format && strcmp(cat->format, "burnpack") == 0;
    sb_init(&J.pool);
    sb_init(&J.meta);
    sb_init(&J.scalars);
    uint64_t data_bytes = 0;
    int rc = collect(&J);
    if (!rc) rc = check_unique_names(&J);
    if (!rc) rc = build_metadata(&J);
    if (!rc && (J.meta.failed || J.scalars.failed)) rc = ckpt_fail(err, -ENOMEM, "out of memory");
    if (!rc) rc = place(&J, &data_bytes);
    if (!rc) rc = write_file(&J, data_bytes);
    if (J.have_doc) json_doc_free(&J.doc);
    sb_free(&J.pool);
    sb_free(&J.meta);
    sb_free(&J.scalars);
    free(J.e);
    return rc;
}

const ckpt_writer writer_burnpack = {.suffix = ".bpk", .write = write_burnpack, .zst_ok = true};
