/* ONNX models (.onnx): a protobuf ModelProto whose graph's initializers are the tensors.
 *
 * Wire format (protobuf encoding guide): a message is a run of fields, each a varint key
 * (field number << 3 | wire type) followed by a varint (type 0), 8 bytes (1), a varint length
 * and that many bytes (2), or 4 bytes (5); types 3 and 4 (groups) are not used by ONNX.
 * Fields of onnx.proto read here:
 *   ModelProto  1 ir_version, 2 producer_name, 3 producer_version, 7 graph, 8 opset_import
 *   GraphProto  2 name, 5 initializer (TensorProto), 15 sparse_initializer
 *   TensorProto 1 dims, 2 data_type, 3 segment, 4 float_data, 5 int32_data, 6 string_data,
 *               7 int64_data, 8 name, 9 raw_data, 10 double_data, 11 uint64_data,
 *               13 external_data (key/value strings), 14 data_location (1 = external)
 * A tensor's bytes are raw_data (little-endian, row-major: served in place, at its offset in
 * the file), a range of an external file (location relative to the model's folder, offset,
 * length: served in place), or one of the typed fields, whose values are varints or
 * fixed-width numbers per element: those are converted into memory once, at open, into one
 * virtual source (bounded by TYPED_LIMIT: exporters write raw_data for anything big).
 *
 * The file is walked through a window of WINDOW bytes, never read whole: an initializer's
 * raw_data is skipped, not loaded. Every length is checked against its enclosing message. */
#include "formats.h"
#include "../io/place.h"
#include "../util/grow.h"
#include "../util/hashmap.h"
#include "../util/strbuf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    WINDOW = 64 << 10,
    NAME_LIMIT = 64 << 10,   /* an initializer's name or an external_data string */
    TYPED_LIMIT = 256 << 20, /* bytes converted from typed fields, all tensors together */
    WIRE_VARINT = 0,
    WIRE_I64 = 1,
    WIRE_LEN = 2,
    WIRE_I32 = 5,
};

typedef struct pbuf {
    const ckpt_catalog *cat;
    uint32_t source;
    const char *path;
    uint64_t size;
    unsigned char win[WINDOW];
    uint64_t win_at;
    size_t win_len;
    ckpt_err *err;
} pbuf;

static int pb_bad(pbuf *b, uint64_t at, const char *what) {
    return ckpt_fail(b->err, -EINVAL, "%s: %s (byte offset %llu)", b->path, what,
                     (unsigned long long)at);
}

/* The byte at `at` (< end, the end of the message being read). */
static int pb_byte(pbuf *b, uint64_t at, uint64_t end, unsigned char *c) {
    if (at >= end) return pb_bad(b, at, "a field runs past the end of its message");
    if (at < b->win_at || at >= b->win_at + b->win_len) {
        uint64_t n = b->size - at < WINDOW ? b->size - at : WINDOW;
        int rc =
            ckpt_source_read(b->cat, b->source, at, b->win, (size_t)n, "protobuf field", b->err);
        if (rc) return rc;
        b->win_at = at;
        b->win_len = (size_t)n;
    }
    *c = b->win[at - b->win_at];
    return 0;
}

static int pb_varint(pbuf *b, uint64_t *at, uint64_t end, uint64_t *v) {
    uint64_t start = *at, x = 0;
    for (unsigned i = 0; i < 10; i++) {
        unsigned char c = 0;
        int rc = pb_byte(b, (*at)++, end, &c);
        if (rc) return rc;
        if (i == 9 && c > 1) return pb_bad(b, start, "a varint holds more than 64 bits");
        x |= (uint64_t)(c & 0x7f) << (7 * i);
        if (!(c & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return pb_bad(b, start, "a varint is longer than 10 bytes");
}

static int pb_fixed(pbuf *b, uint64_t *at, uint64_t end, unsigned n, uint64_t *v) {
    uint64_t x = 0;
    for (unsigned i = 0; i < n; i++) {
        unsigned char c = 0;
        int rc = pb_byte(b, (*at)++, end, &c);
        if (rc) return rc;
        x |= (uint64_t)c << (8 * i);
    }
    *v = x;
    return 0;
}

/* A field's key; for a length-delimited field also its payload [*pay, *pay + *len), checked to
 * lie inside the message, with *at moved past it. */
typedef struct pb_field {
    uint64_t number, wire, at, pay, len, value;
} pb_field;

static int pb_next(pbuf *b, uint64_t *at, uint64_t end, pb_field *f) {
    f->at = *at;
    uint64_t key;
    int rc = pb_varint(b, at, end, &key);
    if (rc) return rc;
    f->number = key >> 3;
    f->wire = key & 7;
    if (f->number == 0) return pb_bad(b, f->at, "a field has number 0");
    switch (f->wire) {
    case WIRE_VARINT:
        return pb_varint(b, at, end, &f->value);
    case WIRE_I64:
        return pb_fixed(b, at, end, 8, &f->value);
    case WIRE_I32:
        return pb_fixed(b, at, end, 4, &f->value);
    case WIRE_LEN:
        if ((rc = pb_varint(b, at, end, &f->len))) return rc;
        if (f->len > end - *at)
            return pb_bad(b, f->at, "a length-delimited field runs past the end of its message");
        f->pay = *at;
        *at += f->len;
        return 0;
    default:
        return pb_bad(b, f->at,
                      "a field has a wire type ONNX does not use (a group, or not "
                      "protobuf at all)");
    }
}

/* The payload of a string field, copied into sb. */
static int pb_string(pbuf *b, const pb_field *f, strbuf *sb, const char *what) {
    if (f->wire != WIRE_LEN) return pb_bad(b, f->at, what);
    if (f->len > NAME_LIMIT) return pb_bad(b, f->at, "a name or string is longer than 64 KiB");
    sb->len = 0;
    for (uint64_t i = 0; i < f->len; i++) {
        unsigned char c = 0;
        int rc = pb_byte(b, f->pay + i, f->pay + f->len, &c);
        if (rc) return rc;
        sb_put(sb, (const char *)&c, 1);
    }
    return sb->failed ? ckpt_fail(b->err, -ENOMEM, "out of memory") : 0;
}

/* onnx.proto's TensorProto.DataType -> ckptfs dtype; false for types ckptfs has no dtype for
 * (STRING, UINT4, INT4, FLOAT4E2M1, and numbers from later versions). */
static bool onnx_dtype(uint64_t t, ckpt_dtype *out) {
    static const int map[] = {
        /* 1 + the dtype; 0: none */
        [1] = 1 + CKPT_F32,          [2] = 1 + CKPT_U8,           [3] = 1 + CKPT_I8,
        [4] = 1 + CKPT_U16,          [5] = 1 + CKPT_I16,          [6] = 1 + CKPT_I32,
        [7] = 1 + CKPT_I64,          [9] = 1 + CKPT_BOOL,         [10] = 1 + CKPT_F16,
        [11] = 1 + CKPT_F64,         [12] = 1 + CKPT_U32,         [13] = 1 + CKPT_U64,
        [14] = 1 + CKPT_C64,         [15] = 1 + CKPT_C128,        [16] = 1 + CKPT_BF16,
        [17] = 1 + CKPT_F8_E4M3,     [18] = 1 + CKPT_F8_E4M3FNUZ, [19] = 1 + CKPT_F8_E5M2,
        [20] = 1 + CKPT_F8_E5M2FNUZ, [24] = 1 + CKPT_F8_E8M0,
    };
    if (t >= sizeof map / sizeof *map || map[t] == 0) return false;
    *out = (ckpt_dtype)(map[t] - 1);
    return true;
}

/* Which typed field holds a data type's values, and how wide each stored value is. */
enum { FIELD_FLOAT = 4, FIELD_INT32 = 5, FIELD_INT64 = 7, FIELD_DOUBLE = 10, FIELD_UINT64 = 11 };
static unsigned typed_field(ckpt_dtype dt) {
    switch (dt) {
    case CKPT_F32:
    case CKPT_C64:
        return FIELD_FLOAT;
    case CKPT_F64:
    case CKPT_C128:
        return FIELD_DOUBLE;
    case CKPT_I64:
        return FIELD_INT64;
    case CKPT_U32:
    case CKPT_U64:
        return FIELD_UINT64;
    default:
        return FIELD_INT32;
    }
}

typedef struct typed_tensor {
    size_t tensor;
    uint64_t at; /* in the typed bytes */
} typed_tensor;

typedef struct loader {
    pbuf b;
    ckpt_catalog *cat;
    const char *dir; /* the model's folder, for external data */
    size_t dir_len;
    hashmap externals; /* location -> source index */
    unsigned char *typed;
    size_t typed_len, typed_cap;
    typed_tensor *typed_tensors;
    size_t ntyped, cap_typed;
    uint64_t initializers, sparse, skipped_strings;
    strbuf name, key, value, location;
    ckpt_err *err;
} loader;

static int typed_put(loader *l, uint64_t v, unsigned width) {
    if (l->typed_len + width > TYPED_LIMIT)
        return ckpt_fail(l->err, -EFBIG,
                         "%s: initializers stored in typed fields (float_data, int32_data, ...) "
                         "take more than 256 MiB; save the model with raw_data (onnx's "
                         "numpy_helper.from_array writes it)",
                         l->b.path);
    if (GROW(l->typed, l->typed_cap, l->typed_len + width))
        return ckpt_fail(l->err, -ENOMEM, "out of memory");
    for (unsigned i = 0; i < width; i++) l->typed[l->typed_len++] = (unsigned char)(v >> (8 * i));
    return 0;
}

/* Appends the values of one occurrence of a typed field (packed, or a single value). */
static int typed_values(loader *l, const pb_field *f, unsigned field, unsigned width,
                        uint64_t *count) {
    bool fixed = field == FIELD_FLOAT || field == FIELD_DOUBLE;
    unsigned stored = field == FIELD_FLOAT ? 4 : 8;
    if (f->wire != WIRE_LEN) {
        if ((fixed && f->wire != (field == FIELD_FLOAT ? WIRE_I32 : WIRE_I64)) ||
            (!fixed && f->wire != WIRE_VARINT))
            return pb_bad(&l->b, f->at, "a typed data field has the wrong wire type");
        (*count)++;
        return typed_put(l, f->value, width);
    }
    uint64_t at = f->pay, end = f->pay + f->len;
    while (at < end) {
        uint64_t v;
        int rc = fixed ? pb_fixed(&l->b, &at, end, stored, &v) : pb_varint(&l->b, &at, end, &v);
        if (rc) return rc;
        (*count)++;
        if ((rc = typed_put(l, v, width))) return rc;
    }
    return 0;
}

typedef struct tensor_fields {
    uint64_t dims[CKPT_MAX_DIMS];
    uint32_t ndim;
    uint64_t data_type;
    bool have_type, have_raw, external, have_name;
    uint64_t raw_at, raw_len;
    uint64_t typed_start, typed_count; /* values appended for this tensor */
    unsigned typed_fields;             /* how many distinct typed fields occurred */
    uint64_t ext_offset, ext_length;
    bool have_location, have_ext_length;
} tensor_fields;

static int parse_u64_text(loader *l, const pb_field *f, const strbuf *s, uint64_t *v) {
    uint64_t x = 0;
    if (s->len == 0) return pb_bad(&l->b, f->at, "external_data offset or length is empty");
    for (size_t i = 0; i < s->len; i++) {
        unsigned d = (unsigned)(unsigned char)s->data[i] - '0';
        if (d > 9 || x > (UINT64_MAX - d) / 10)
            return pb_bad(&l->b, f->at, "external_data offset or length is not a decimal u64");
        x = x * 10 + d;
    }
    *v = x;
    return 0;
}

static int external_entry(loader *l, const pb_field *f, tensor_fields *t) {
    uint64_t at = f->pay, end = f->pay + f->len;
    bool have_key = false, have_value = false;
    l->key.len = l->value.len = 0;
    while (at < end) {
        pb_field g;
        int rc = pb_next(&l->b, &at, end, &g);
        if (rc) return rc;
        if (g.number == 1) {
            if ((rc = pb_string(&l->b, &g, &l->key, "external_data key is not a string")))
                return rc;
            have_key = true;
        } else if (g.number == 2) {
            if ((rc = pb_string(&l->b, &g, &l->value, "external_data value is not a string")))
                return rc;
            have_value = true;
        }
    }
    if (!have_key || !have_value)
        return pb_bad(&l->b, f->at, "an external_data entry lacks its key or value");
    if (l->key.len == 8 && memcmp(l->key.data, "location", 8) == 0) {
        l->location.len = 0; /* the buffer is kept for the next initializer's location */
        sb_put(&l->location, l->value.data, l->value.len);
        t->have_location = true;
        return l->location.failed ? ckpt_fail(l->err, -ENOMEM, "out of memory") : 0;
    }
    if (l->key.len == 6 && memcmp(l->key.data, "offset", 6) == 0)
        return parse_u64_text(l, f, &l->value, &t->ext_offset);
    if (l->key.len == 6 && memcmp(l->key.data, "length", 6) == 0) {
        t->have_ext_length = true;
        return parse_u64_text(l, f, &l->value, &t->ext_length);
    }
    return 0; /* checksum and keys of later versions: not needed to read the bytes */
}

static int tensor_field(loader *l, const pb_field *f, tensor_fields *t, unsigned *seen) {
    switch (f->number) {
    case 1: /* dims: packed, or one value per occurrence */
        if (f->wire == WIRE_VARINT) {
            if (t->ndim == CKPT_MAX_DIMS) return pb_bad(&l->b, f->at, "more than 32 dims");
            t->dims[t->ndim++] = f->value;
            return 0;
        } else if (f->wire == WIRE_LEN) {
            uint64_t at = f->pay, end = f->pay + f->len;
            while (at < end) {
                if (t->ndim == CKPT_MAX_DIMS) return pb_bad(&l->b, f->at, "more than 32 dims");
                int rc = pb_varint(&l->b, &at, end, &t->dims[t->ndim++]);
                if (rc) return rc;
            }
            return 0;
        }
        return pb_bad(&l->b, f->at, "dims has the wrong wire type");
    case 2:
        if (f->wire != WIRE_VARINT) return pb_bad(&l->b, f->at, "data_type is not a varint");
        t->data_type = f->value;
        t->have_type = true;
        return 0;
    case 3:
        return pb_bad(&l->b, f->at,
                      "the initializer is split into segments, which ONNX "
                      "deprecated and ckptfs does not read");
    case 8:
        t->have_name = true;
        return pb_string(&l->b, f, &l->name, "name is not a string");
    case 9:
        if (f->wire != WIRE_LEN) return pb_bad(&l->b, f->at, "raw_data is not length-delimited");
        t->have_raw = true;
        t->raw_at = f->pay;
        t->raw_len = f->len;
        return 0;
    case 13:
        if (f->wire != WIRE_LEN) return pb_bad(&l->b, f->at, "external_data is not a message");
        return external_entry(l, f, t);
    case 14:
        if (f->wire != WIRE_VARINT) return pb_bad(&l->b, f->at, "data_location is not a varint");
        t->external = f->value == 1;
        return 0;
    case FIELD_FLOAT:
    case FIELD_INT32:
    case FIELD_INT64:
    case FIELD_DOUBLE:
    case FIELD_UINT64:
        *seen |= 1u << f->number;
        return 0; /* read in a second pass, once data_type is known */
    case 6:
        *seen |= 1u << 6;
        return 0;
    default:
        return 0;
    }
}

static const char *shown(const strbuf *s) {
    return ckpt_shown(s->data ? s->data : "", s->len);
}

/* An external file's source index, registered on first use. The location is relative to the
 * model's folder and may not leave it (no absolute path, no ".." component), as onnx's own
 * checker requires: a model must not read whatever file its writer names. */
static int external_source(loader *l, const tensor_fields *t, uint64_t at, uint32_t *src) {
    const char *p = l->location.data;
    size_t n = l->location.len;
    bool up = false;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && p[j] != '/' && p[j] != '\\') j++;
        if ((j - i == 2 && p[i] == '.' && p[i + 1] == '.') || j == i) up = true;
        i = j + 1;
    }
    if (!t->have_location || n == 0 || p[0] == '/' || up || memchr(p, 0, n))
        return pb_bad(&l->b, at,
                      "external data location is missing, absolute, empty or "
                      "climbs out of the model's folder ('..')");
    const hm_entry *e = hm_get(&l->externals, p, n);
    if (e) {
        *src = (uint32_t)e->value;
        return 0;
    }
    strbuf full;
    sb_init(&full);
    sb_printf(&full, "%.*s%.*s", (int)l->dir_len, l->dir, (int)n, p);
    if (full.failed) return ckpt_fail(l->err, -ENOMEM, "out of memory");
    int rc = catalog_add_source(l->cat, full.data, full.data + l->dir_len, src, l->err);
    if (rc) {
        sb_free(&full);
        return rc;
    }
    /* the key points into the catalog's copy of the relative path, which lives as long */
    const char *key = l->cat->sources[*src].relpath;
    bool added;
    if (!hm_put(&l->externals, key, strlen(key), *src, &added))
        rc = ckpt_fail(l->err, -ENOMEM, "out of memory");
    sb_free(&full);
    return rc;
}

static int initializer(loader *l, const pb_field *msg) {
    tensor_fields t;
    memset(&t, 0, sizeof t);
    unsigned seen = 0;
    l->name.len = 0;
    uint64_t at = msg->pay, end = msg->pay + msg->len;
    int rc = 0;
    while (!rc && at < end) {
        pb_field f;
        if (!(rc = pb_next(&l->b, &at, end, &f))) rc = tensor_field(l, &f, &t, &seen);
    }
    if (rc) return rc;
    l->initializers++;
    if (!t.have_name || l->name.len == 0)
        return pb_bad(&l->b, msg->at, "an initializer has no name");
    ckpt_dtype dt;
    if (!t.have_type) return pb_bad(&l->b, msg->at, "an initializer has no data_type");
    if (t.data_type == 8) { /* STRING: no fixed element size, nothing to show as bytes */
        l->skipped_strings++;
        return 0;
    }
    if (!onnx_dtype(t.data_type, &dt)) {
        char what[200];
        snprintf(what, sizeof what,
                 "initializer \"%s\" has data_type %llu, which ckptfs has "
                 "no dtype for",
                 shown(&l->name), (unsigned long long)t.data_type);
        return pb_bad(&l->b, msg->at, what);
    }
    uint64_t numel, nbytes;
    if (!catalog_shape_nbytes(t.dims, t.ndim, dt, &numel, &nbytes))
        return pb_bad(&l->b, msg->at, "an initializer's dims overflow");
    size_t index;
    if ((rc = catalog_add_tensor(l->cat, l->name.data, l->name.len, dt, t.ndim, t.dims, &index,
                                 l->err)))
        return rc;
    unsigned field = typed_field(dt);
    unsigned sources = (unsigned)t.have_raw + (unsigned)t.external + ((seen >> field) & 1u);
    if (sources > 1 || (seen & ~(1u << field) & 0xfff))
        return pb_bad(&l->b, msg->at,
                      "an initializer holds its data in more than one field, "
                      "or in a field its data_type does not use");
    if (t.have_raw) {
        if (t.raw_len != nbytes) {
            char what[240];
            snprintf(what, sizeof what,
                     "initializer \"%s\": raw_data holds %llu bytes, its "
                     "dims and data_type take %llu",
                     shown(&l->name), (unsigned long long)t.raw_len, (unsigned long long)nbytes);
            return pb_bad(&l->b, t.raw_at, what);
        }
        return catalog_add_piece(l->cat, index, l->b.source, t.raw_at, NULL, NULL, NULL, l->err);
    }
    if (t.external) {
        uint32_t src;
        if ((rc = external_source(l, &t, msg->at, &src))) return rc;
        if (t.have_ext_length && t.ext_length != nbytes)
            return pb_bad(&l->b, msg->at,
                          "external_data length differs from what the "
                          "initializer's dims and data_type take");
        /* catalog_finish checks the range against the external file's size */
        return catalog_add_piece(l->cat, index, src, t.ext_offset, NULL, NULL, NULL, l->err);
    }
    /* typed field: a second pass over the message reads its values */
    unsigned width = ckpt_dtype_elem_size(dt);
    unsigned per = dt == CKPT_C64 || dt == CKPT_C128 ? 2 : 1;
    if (per == 2) width /= 2;
    if (GROW(l->typed_tensors, l->cap_typed, l->ntyped + 1))
        return ckpt_fail(l->err, -ENOMEM, "out of memory");
    uint64_t start = l->typed_len, count = 0;
    at = msg->pay;
    while (!rc && at < end) {
        pb_field f;
        if (!(rc = pb_next(&l->b, &at, end, &f)) && f.number == field)
            rc = typed_values(l, &f, field, width, &count);
    }
    if (rc) return rc;
    if (count != numel * per) {
        char what[240];
        snprintf(what, sizeof what,
                 "initializer \"%s\" holds %llu values, its dims call for "
                 "%llu",
                 shown(&l->name), (unsigned long long)count, (unsigned long long)(numel * per));
        return pb_bad(&l->b, msg->at, what);
    }
    l->typed_tensors[l->ntyped++] = (typed_tensor){index, start};
    return 0;
}

static int graph(loader *l, const pb_field *g) {
    uint64_t at = g->pay, end = g->pay + g->len;
    int rc = 0;
    while (!rc && at < end) {
        pb_field f;
        if ((rc = pb_next(&l->b, &at, end, &f))) break;
        if (f.number == 5 && f.wire == WIRE_LEN)
            rc = initializer(l, &f);
        else if (f.number == 15)
            l->sparse++;
    }
    return rc;
}

static int add_typed_source(loader *l) {
    if (!l->ntyped) return 0;
    uint32_t src;
    int rc = catalog_add_memory_source(l->cat, "(onnx typed fields)", l->typed, l->typed_len, &src,
                                       l->err);
    l->typed = NULL;
    for (size_t i = 0; !rc && i < l->ntyped; i++)
        rc = catalog_add_piece(l->cat, l->typed_tensors[i].tensor, src, l->typed_tensors[i].at,
                               NULL, NULL, NULL, l->err);
    return rc;
}

/* One OperatorSetIdProto (1 domain, 2 version) as a JSON member of the document. */
static int opset(loader *l, const pb_field *f, strbuf *doc, unsigned n) {
    uint64_t at = f->pay, end = f->pay + f->len, version = 0;
    l->value.len = 0;
    int rc = 0;
    while (!rc && at < end) {
        pb_field g;
        if ((rc = pb_next(&l->b, &at, end, &g))) break;
        if (g.number == 1)
            rc = pb_string(&l->b, &g, &l->value, "opset domain is not a string");
        else if (g.number == 2 && g.wire == WIRE_VARINT)
            version = g.value;
    }
    if (rc) return rc;
    sb_printf(doc, "%s{\"domain\": ", n ? ", " : "");
    sb_json_str(doc, l->value.data ? l->value.data : "", l->value.len);
    sb_printf(doc, ", \"version\": %llu}", (unsigned long long)version);
    return 0;
}

/* The graph's name, for the document, without reading its initializers a second time. */
static int graph_name(loader *l, const pb_field *g, strbuf *doc) {
    uint64_t at = g->pay, end = g->pay + g->len;
    while (at < end) {
        pb_field f;
        int rc = pb_next(&l->b, &at, end, &f);
        if (rc) return rc;
        if (f.number == 2 && f.wire == WIRE_LEN) {
            if ((rc = pb_string(&l->b, &f, &l->value, "graph name is not a string"))) return rc;
            sb_json_str(doc, l->value.data ? l->value.data : "", l->value.len);
            return 0;
        }
    }
    sb_printf(doc, "null");
    return 0;
}

/* Walks the ModelProto; the document gets its ir_version, producer, opsets and counts. */
static int model(loader *l, strbuf *doc) {
    uint64_t at = 0, end = l->b.size, ir_version = 0;
    pb_field graph_field = {0};
    bool have_graph = false, have_ir = false;
    strbuf producer, opsets;
    sb_init(&producer);
    sb_init(&opsets);
    unsigned nopsets = 0;
    int rc = 0;
    while (!rc && at < end) {
        pb_field f;
        if ((rc = pb_next(&l->b, &at, end, &f))) break;
        if (f.number == 1 && f.wire == WIRE_VARINT) {
            ir_version = f.value;
            have_ir = true;
        } else if ((f.number == 2 || f.number == 3) && f.wire == WIRE_LEN) {
            if (!(rc = pb_string(&l->b, &f, &l->value, "producer is not a string"))) {
                sb_printf(&producer,
                          ", \"%s\": ", f.number == 2 ? "producer_name" : "producer_version");
                sb_json_str(&producer, l->value.data ? l->value.data : "", l->value.len);
            }
        } else if (f.number == 7 && f.wire == WIRE_LEN) {
            if (have_graph) rc = pb_bad(&l->b, f.at, "the model has two graph fields");
            have_graph = true;
            graph_field = f;
        } else if (f.number == 8 && f.wire == WIRE_LEN) {
            rc = opset(l, &f, &opsets, nopsets++);
        }
    }
    if (!rc && !have_ir) rc = pb_bad(&l->b, 0, "the model has no ir_version (field 1)");
    if (!rc && !have_graph) rc = pb_bad(&l->b, 0, "the model has no graph (field 7)");
    if (!rc) rc = graph(l, &graph_field);
    if (!rc) {
        sb_printf(doc, "{\"ir_version\": %llu%.*s, \"opset_import\": [%.*s], \"graph\": ",
                  (unsigned long long)ir_version, (int)producer.len,
                  producer.data ? producer.data : "", (int)opsets.len,
                  opsets.data ? opsets.data : "");
        rc = graph_name(l, &graph_field, doc);
        sb_printf(doc,
                  ", \"initializers\": %llu, \"string_initializers_not_shown\": %llu, "
                  "\"sparse_initializers_not_shown\": %llu}",
                  (unsigned long long)l->initializers, (unsigned long long)l->skipped_strings,
                  (unsigned long long)l->sparse);
    }
    if (!rc && (producer.failed || opsets.failed || doc->failed))
        rc = ckpt_fail(l->err, -ENOMEM, "out of memory");
    sb_free(&producer);
    sb_free(&opsets);
    return rc;
}

/* ONNX has no magic number. A ModelProto as onnx writes it starts with ir_version (key 0x08)
 * and a small version, then another ModelProto field: that is what is checked; the
 * suffix catches the rest, so that a damaged .onnx gets this decoder's complaint. */
static bool probe(const unsigned char *head, size_t n, uint64_t file_size) {
    (void)file_size;
    if (n < 4 || head[0] != 0x08 || head[1] == 0 || head[1] > 30) return false;
    unsigned key = head[2], number = key >> 3, wire = key & 7;
    return (number >= 2 && number <= 8 && wire == WIRE_LEN) || (number == 5 && wire == 0) ||
           (number == 14 && wire == WIRE_LEN);
}

static int load(ckpt_catalog *cat, uint32_t source, ckpt_err *err) {
    loader *l = calloc(1, sizeof *l);
    if (!l) return ckpt_fail(err, -ENOMEM, "out of memory");
    const ckpt_source *s = &cat->sources[source];
    l->b = (pbuf){.cat = cat, .source = source, .path = s->path, .size = s->size, .err = err};
    l->cat = cat;
    l->err = err;
    const char *slash = strrchr(s->path, '/');
    l->dir = s->path;
    l->dir_len = slash ? (size_t)(slash - s->path) + 1 : 0;
    sb_init(&l->name);
    sb_init(&l->key);
    sb_init(&l->value);
    sb_init(&l->location);
    strbuf doc;
    sb_init(&doc);
    int rc = hm_init(&l->externals, 8) ? 0 : ckpt_fail(err, -ENOMEM, "out of memory");
    if (!rc) rc = model(l, &doc);
    if (!rc) rc = add_typed_source(l);
    if (!rc) rc = catalog_add_doc(cat, "onnx", doc.data, doc.len, err);
    if (!rc && l->skipped_strings)
        catalog_warn(cat,
                     "%llu STRING initializers are not shown: their elements have no "
                     "fixed size",
                     (unsigned long long)l->skipped_strings);
    if (!rc && l->sparse)
        catalog_warn(cat, "%llu sparse initializers are not shown", (unsigned long long)l->sparse);
    hm_free(&l->externals);
    sb_free(&doc);
    sb_free(&l->name);
    sb_free(&l->key);
    sb_free(&l->value);
    sb_free(&l->location);
    free(l->typed);
    free(l->typed_tensors);
    free(l);
    return rc;
}

static const char *const suffixes[] = {".onnx", NULL};

const ckpt_format format_onnx = {
    .name = "onnx",
    .label = "ONNX",
    .probe = probe,
    .load = load,
    .suffixes = suffixes,
    .no_magic = true,
};
