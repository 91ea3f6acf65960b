/* The GGUF layout (gguf_layout.h): version 3, little-endian, laid out the way ggml's own reader
 * insists on, so that llama.cpp, gguf-py and ckptfs all read the result.
 *
 *   "GGUF", u32 version 3, u64 tensor_count, u64 kv_count, the KVs, the tensor infos (name,
 *   u32 n_dims, n_dims x u64 ne with ne[0] the fastest dimension, u32 ggml type, u64 offset),
 *   zero padding to the alignment, then the tensors in info order, each padded with zeros to a
 *   multiple of the alignment (the last one too: ggml reads the padded total).
 *
 * Decisions:
 * - Alignment 32, written as general.alignment (UINT32) so no reader has to assume it.
 * - "ckptfs.source_format" (STRING) names the format the tensors came from.
 * - From a GGUF source the KVs of its first part are copied byte for byte, in their order and
 *   with their types (metadata.json shows them only as JSON, which loses the types), except
 *   general.alignment, the split.* keys and ckptfs.source_format, which this file restates.
 *   Other sources have no GGUF metadata: general.architecture and the like are not invented,
 *   except from a "gguf_kv" document (profile_llamacpp.c: a JSON array of [key, type, value],
 *   type str, u32, f32, arr_str or arr_i32), whose KVs are written after the copied ones.
 * - Refused, naming the tensor: dtypes ggml has no type for (BOOL, unsigned, complex, F8, F4,
 *   F6), more than 4 dims, names of 64 bytes or more (ggml's GGML_MAX_NAME counts the NUL),
 *   names that are not UTF-8 or hold a NUL, a block type whose last dim is not a whole number
 *   of blocks, incomplete tensors, and two model tensors with one name.
 * - A scalar is written with n_dims 0 (ggml and ckptfs read it back as a scalar; a [1] would
 *   change its shape). */
#include "gguf_layout.h"

#include "writers/writers.h"
#include "../model/catalog.h"
#include "../util/json.h"
#include "../util/le.h"
#include "../util/strbuf.h"
#include "../util/utf8.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    ALIGNMENT = 32,
    NAME_LIMIT = 63, /* GGML_MAX_NAME is 64 with the terminating NUL */
    GGML_MAX_DIMS = 4,
    KEY_LIMIT = 65536,    /* as the reader; copied keys never come near it */
    NESTING_LIMIT = 16,   /* as the reader */
    COPY_CHUNK = 1 << 16, /* bytes copied at a time from the source's KV section */
};

/* gguf_type ids of KV values */
enum { V_U32 = 4, V_I32 = 5, V_F32 = 6, V_BOOL = 7, V_STRING = 8, V_ARRAY = 9, V_COUNT = 13 };
static const unsigned value_size[V_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

/* ggml_type id of each dtype ggml has a type for; -1 for the rest. */
static int ggml_type_of(ckpt_dtype dt) {
    switch (dt) {
    case CKPT_F32:
        return 0;
    case CKPT_F16:
        return 1;
    case CKPT_Q4_0:
        return 2;
    case CKPT_Q4_1:
        return 3;
    case CKPT_Q5_0:
        return 6;
    case CKPT_Q5_1:
        return 7;
    case CKPT_Q8_0:
        return 8;
    case CKPT_Q8_1:
        return 9;
    case CKPT_Q2_K:
        return 10;
    case CKPT_Q3_K:
        return 11;
    case CKPT_Q4_K:
        return 12;
    case CKPT_Q5_K:
        return 13;
    case CKPT_Q6_K:
        return 14;
    case CKPT_Q8_K:
        return 15;
    case CKPT_IQ2_XXS:
        return 16;
    case CKPT_IQ2_XS:
        return 17;
    case CKPT_IQ3_XXS:
        return 18;
    case CKPT_IQ1_S:
        return 19;
    case CKPT_IQ4_NL:
        return 20;
    case CKPT_IQ3_S:
        return 21;
    case CKPT_IQ2_S:
        return 22;
    case CKPT_IQ4_XS:
        return 23;
    case CKPT_I8:
        return 24;
    case CKPT_I16:
        return 25;
    case CKPT_I32:
        return 26;
    case CKPT_I64:
        return 27;
    case CKPT_F64:
        return 28;
    case CKPT_IQ1_M:
        return 29;
    case CKPT_BF16:
        return 30;
    case CKPT_TQ1_0:
        return 34;
    case CKPT_TQ2_0:
        return 35;
    case CKPT_MXFP4:
        return 39;
    case CKPT_NVFP4:
        return 40;
    case CKPT_Q1_0:
        return 41;
    case CKPT_Q2_0:
        return 42;
    default:
        return -1;
    }
}

static uint64_t pad_to(uint64_t x) {
    return (ALIGNMENT - x % ALIGNMENT) % ALIGNMENT;
}

static void put_u32(strbuf *f, uint32_t v) {
    unsigned char b[4];
    put_le32(b, v);
    sb_put(f, b, 4);
}

static void put_u64(strbuf *f, uint64_t v) {
    unsigned char b[8];
    put_le64(b, v);
    sb_put(f, b, 8);
}

static void put_str(strbuf *f, const char *s, size_t n) {
    put_u64(f, n);
    sb_put(f, s, n);
}

/* ---- what may be written ---- */

static int check_tensor(const out_file *named, const ckpt_tensor *t, ckpt_err *err) {
    const char *out = named->final_path;
    const char *shown = ckpt_shown(t->name, t->name_len);
    int n = -1; /* "%.*s" prints all of shown */
    const ckpt_dtype_info *info = ckpt_dtype_info_of(t->dtype);
    if (t->incomplete)
        return ckpt_fail(err, -EIO,
                         "%s: tensor \"%.*s\" is incomplete (part of it is stored "
                         "nowhere)",
                         out, n, shown);
    if (ggml_type_of(t->dtype) < 0)
        return ckpt_fail(err, -EINVAL,
                         "%s: tensor \"%.*s\" is %s, which GGUF cannot hold (ggml has F32, F16, "
                         "BF16, F64, I8, I16, I32, I64 and its block types)",
                         out, n, shown, info->name);
    if (t->ndim > GGML_MAX_DIMS)
        return ckpt_fail(err, -EINVAL,
                         "%s: tensor \"%.*s\" has %u dims, more than the %d GGUF (ggml) can hold",
                         out, n, shown, t->ndim, GGML_MAX_DIMS);
    if (t->name_len > NAME_LIMIT)
        return ckpt_fail(err, -EINVAL,
                         "%s: tensor \"%.*s\": the name has %zu bytes, more than the %d GGUF "
                         "(ggml) allows",
                         out, n, shown, t->name_len, NAME_LIMIT);
    if (memchr(t->name, 0, t->name_len) || !utf8_valid(t->name, t->name_len))
        return ckpt_fail(err, -EINVAL,
                         "%s: tensor \"%.*s\": the name is not UTF-8 without NUL bytes, as GGUF "
                         "strings must be",
                         out, n, shown);
    if (info->block > 1 && (t->ndim == 0 || t->shape[t->ndim - 1] % info->block))
        return ckpt_fail(err, -EINVAL,
                         "%s: tensor \"%.*s\": its last dim is not a whole number of %s blocks "
                         "of %u, as ggml's ne[0] must be",
                         out, n, shown, info->name, info->block);
    for (uint32_t d = 0; d < t->ndim; d++)
        if (t->shape[d] > INT64_MAX)
            return ckpt_fail(err, -EINVAL, "%s: tensor \"%.*s\": dim %u exceeds ggml's int64", out,
                             n, shown, d);
    return 0;
}

/* ---- KVs of a GGUF source, copied as they are ---- */

typedef struct kv_span {
    uint64_t at, len;
} kv_span;

/* Buffered reads of the source file; every read is bounds-checked because the file is read a
 * second time here, after the decoder checked it. */
typedef struct src {
    const ckpt_catalog *cat;
    uint32_t source;
    const char *path;
    uint64_t size, pos;
    unsigned char buf[COPY_CHUNK];
    uint64_t buf_at;
    size_t buf_len;
    ckpt_err *err;
} src;

static int src_bad(src *s, const char *what) {
    return ckpt_fail(s->err, -EINVAL,
                     "%s: %s at offset %llu runs past the end of the file (size %llu) while "
                     "copying its KVs; did the file change?",
                     s->path, what, (unsigned long long)s->pos, (unsigned long long)s->size);
}

/* Copies n (<= 64) bytes at pos into out and moves past them. */
static int src_take(src *s, void *out, size_t n, const char *what) {
    if (s->pos > s->size || n > s->size - s->pos) return src_bad(s, what);
    if (s->pos < s->buf_at || s->pos + n > s->buf_at + s->buf_len) {
        uint64_t len = s->size - s->pos < COPY_CHUNK ? s->size - s->pos : COPY_CHUNK;
        s->buf_len = 0;
        int rc = ckpt_source_read(s->cat, s->source, s->pos, s->buf, (size_t)len, what, s->err);
        if (rc) return rc;
        s->buf_at = s->pos;
        s->buf_len = (size_t)len;
    }
    memcpy(out, s->buf + (s->pos - s->buf_at), n);
    s->pos += n;
    return 0;
}

static int src_u32(src *s, uint32_t *v, const char *what) {
    unsigned char b[4];
    int rc = src_take(s, b, 4, what);
    *v = le32(b);
    return rc;
}

static int src_u64(src *s, uint64_t *v, const char *what) {
    uint32_t lo = 0, hi = 0;
    int rc = src_u32(s, &lo, what);
    if (!rc) rc = src_u32(s, &hi, what);
    *v = (uint64_t)hi << 32 | lo;
    return rc;
}

static int src_skip(src *s, uint64_t n, const char *what) {
    if (s->pos > s->size || n > s->size - s->pos) return src_bad(s, what);
    s->pos += n;
    return 0;
}

static int skip_value(src *s, uint32_t type, unsigned depth) {
    if (type >= V_COUNT)
        return ckpt_fail(s->err, -EINVAL, "%s: value type %u at offset %llu is not a GGUF type",
                         s->path, type, (unsigned long long)(s->pos - 4));
    if (value_size[type]) return src_skip(s, value_size[type], "value");
    uint64_t len;
    int rc;
    if (type == V_STRING) {
        if ((rc = src_u64(s, &len, "string length"))) return rc;
        return src_skip(s, len, "string");
    }
    uint32_t elem;
    if ((rc = src_u32(s, &elem, "array element type")) || (rc = src_u64(s, &len, "array length")))
        return rc;
    if (elem >= V_COUNT || (elem == V_ARRAY && depth + 1 >= NESTING_LIMIT))
        return ckpt_fail(s->err, -EINVAL,
                         "%s: array element type %u at offset %llu cannot be copied", s->path, elem,
                         (unsigned long long)(s->pos - 12));
    if (value_size[elem]) {
        if (len > (s->size - s->pos) / value_size[elem]) return src_bad(s, "array");
        return src_skip(s, len * value_size[elem], "array");
    }
    if (len > (s->size - s->pos) / 8) return src_bad(s, "array");
    for (uint64_t i = 0; i < len; i++)
        if ((rc = skip_value(s, elem, depth + 1))) return rc;
    return 0;
}

/* Keys this file states itself. */
static bool restated(const char *key, size_t len) {
    static const char *const exact[] = {"general.alignment", "ckptfs.source_format"};
    for (size_t i = 0; i < sizeof exact / sizeof *exact; i++)
        if (len == strlen(exact[i]) && memcmp(key, exact[i], len) == 0) return true;
    return len >= 6 && memcmp(key, "split.", 6) == 0;
}

/* The source file whose KVs are the model's: the first part named in the gguf_files doc. */
static int find_gguf_source(const ckpt_catalog *cat, int64_t *source, ckpt_err *err) {
    *source = -1;
    const ckpt_doc *doc = NULL;
    for (size_t i = 0; i < cat->ndocs; i++)
        if (strcmp(cat->docs[i].key, "gguf_files") == 0) doc = &cat->docs[i];
    if (!doc) return 0;
    json_doc jd;
    json_error jerr;
    if (json_parse(&jd, doc->json, doc->len, &jerr))
        return ckpt_fail(err, -EINVAL, "gguf_files document: %s", jerr.msg);
    const json_value *first = jd.root->type == JSON_ARRAY ? jd.root->head : NULL;
    const json_value *file = first ? json_member(first, "file") : NULL;
    for (uint32_t i = 0; file && file->type == JSON_STRING && i < cat->nsources; i++) {
        const char *rel = cat->sources[i].relpath;
        if (strlen(rel) == file->len && memcmp(rel, file->str, file->len) == 0) *source = i;
    }
    json_doc_free(&jd);
    return 0;
}

/* Spans of the KVs to copy, in file order. */
static int scan_kvs(src *s, kv_span **spans, size_t *nspans) {
    unsigned char head[24];
    int rc = src_take(s, head, 24, "header");
    if (rc) return rc;
    uint64_t count = le64(head + 16);
    if (memcmp(head, "GGUF", 4) != 0 || count > (s->size - s->pos) / 13)
        return ckpt_fail(s->err, -EINVAL, "%s: not the GGUF file it was when opened", s->path);
    kv_span *sp = malloc((count ? count : 1) * sizeof *sp);
    if (!sp) return ckpt_fail(s->err, -ENOMEM, "out of memory");
    size_t n = 0;
    for (uint64_t i = 0; i < count && !rc; i++) {
        uint64_t at = s->pos, len;
        char key[24];
        uint32_t type;
        if ((rc = src_u64(s, &len, "key length"))) break;
        if (len > KEY_LIMIT) {
            rc = ckpt_fail(s->err, -EINVAL, "%s: key length %llu at offset %llu is too long",
                           s->path, (unsigned long long)len, (unsigned long long)at);
            break;
        }
        size_t shown = len < sizeof key ? (size_t)len : sizeof key;
        if ((rc = src_take(s, key, shown, "key")) || (rc = src_skip(s, len - shown, "key")) ||
            (rc = src_u32(s, &type, "value type")) || (rc = skip_value(s, type, 0)))
            break;
        if (!restated(key, (size_t)len)) sp[n++] = (kv_span){at, s->pos - at};
    }
    if (rc) {
        free(sp);
        return rc;
    }
    *spans = sp;
    *nspans = n;
    return 0;
}

static int copy_span(strbuf *f, src *s, kv_span sp) {
    for (uint64_t done = 0; done < sp.len;) {
        size_t n = sp.len - done < COPY_CHUNK ? (size_t)(sp.len - done) : COPY_CHUNK;
        int rc = ckpt_source_read(s->cat, s->source, sp.at + done, s->buf, n, "KV", s->err);
        if (rc) return rc;
        sb_put(f, s->buf, n);
        done += n;
    }
    return 0;
}

/* ---- the file ---- */

static void put_kv_u32(strbuf *f, const char *key, uint32_t v) {
    put_str(f, key, strlen(key));
    put_u32(f, V_U32);
    put_u32(f, v);
}

static void put_kv_str(strbuf *f, const char *key, const char *v) {
    put_str(f, key, strlen(key));
    put_u32(f, V_STRING);
    put_str(f, v, strlen(v));
}

/* ---- KVs of a gguf_kv document ---- */

static const ckpt_doc *kv_doc(const ckpt_catalog *cat) {
    for (size_t i = 0; i < cat->ndocs; i++)
        if (strcmp(cat->docs[i].key, "gguf_kv") == 0) return &cat->docs[i];
    return NULL;
}

static bool num_u32(const json_value *v, uint32_t *out) {
    uint64_t x;
    if (!json_as_u64(v, &x) || x > UINT32_MAX) return false;
    *out = (uint32_t)x;
    return true;
}

static bool num_f32(const json_value *v, float *out) {
    char buf[64];
    if (!v || v->type != JSON_NUMBER || v->len >= sizeof buf) return false;
    memcpy(buf, v->str, v->len);
    buf[v->len] = '\0';
    *out = strtof(buf, NULL);
    return true;
}

static bool num_i32(const json_value *v, int32_t *out) {
    char buf[32], *end;
    if (!v || v->type != JSON_NUMBER || v->len >= sizeof buf) return false;
    memcpy(buf, v->str, v->len);
    buf[v->len] = '\0';
    long x = strtol(buf, &end, 10);
    if (*end || x < INT32_MIN || x > INT32_MAX) return false;
    *out = (int32_t)x;
    return true;
}

/* Writes the records (or with f NULL only checks them); *count is how many. */
static int put_doc_kvs(strbuf *f, const json_value *arr, uint64_t *count, ckpt_err *err) {
    *count = 0;
    for (const json_value *r = arr->head; r; r = r->next) {
        const json_value *k = r->type == JSON_ARRAY && r->count == 3 ? r->head : NULL;
        const json_value *t = k ? k->next : NULL, *v = t ? t->next : NULL;
        uint32_t u = 0;
        float x = 0;
        int32_t i32 = 0;
        bool ok = k && k->type == JSON_STRING && t->type == JSON_STRING;
        if (ok && json_str_eq(t, "str"))
            ok = v->type == JSON_STRING;
        else if (ok && json_str_eq(t, "u32"))
            ok = num_u32(v, &u);
        else if (ok && json_str_eq(t, "f32"))
            ok = num_f32(v, &x);
        else if (ok && json_str_eq(t, "bool"))
            ok = v->type == JSON_TRUE || v->type == JSON_FALSE;
        else if (ok && (json_str_eq(t, "arr_str") || json_str_eq(t, "arr_i32")))
            ok = v->type == JSON_ARRAY;
        else
            ok = false;
        if (!ok)
            return ckpt_fail(err, -EINVAL,
                             "gguf_kv document: record %llu is not [key, type, value]",
                             (unsigned long long)*count);
        ++*count;
        if (!f) continue;
        put_str(f, k->str, k->len);
        if (json_str_eq(t, "str")) {
            put_u32(f, V_STRING);
            put_str(f, v->str, v->len);
        } else if (json_str_eq(t, "u32")) {
            put_u32(f, V_U32);
            put_u32(f, u);
        } else if (json_str_eq(t, "bool")) {
            put_u32(f, V_BOOL);
            uint8_t b = v->type == JSON_TRUE;
            sb_put(f, &b, 1);
        } else if (json_str_eq(t, "f32")) {
            uint32_t bits;
            memcpy(&bits, &x, 4);
            put_u32(f, V_F32);
            put_u32(f, bits);
        } else {
            bool strs = json_str_eq(t, "arr_str");
            put_u32(f, V_ARRAY);
            put_u32(f, strs ? V_STRING : V_I32);
            put_u64(f, v->count);
            for (const json_value *e = v->head; e; e = e->next) {
                if (strs && e->type == JSON_STRING) {
                    put_str(f, e->str, e->len);
                } else if (!strs && num_i32(e, &i32)) {
                    put_u32(f, (uint32_t)i32);
                } else {
                    return ckpt_fail(err, -EINVAL, "gguf_kv document: \"%.*s\": a bad element",
                                     (int)(k->len > 60 ? 60 : k->len), k->str);
                }
            }
        }
    }
    return 0;
}

/* llama.cpp's general.file_type (its llama_ftype) for the type most bytes of the matrices are
 * in, as its converter writes the --outtype it was given; -1 for a mix it has no name for.
 * Vectors (norms, biases) are F32 in every llama.cpp file type, so only matrices count. */
static int64_t llama_file_type(const ckpt_catalog *cat, const size_t *sel, size_t n) {
    static const struct {
        ckpt_dtype dt;
        int ftype;
    } names[] = {{CKPT_F32, 0},  {CKPT_F16, 1},  {CKPT_Q4_0, 2},  {CKPT_Q4_1, 3}, {CKPT_Q8_0, 7},
                 {CKPT_Q5_0, 8}, {CKPT_Q5_1, 9}, {CKPT_Q6_K, 18}, {CKPT_BF16, 32}};
    uint64_t bytes[sizeof names / sizeof *names] = {0}, most = 0;
    int64_t ftype = -1;
    for (size_t i = 0; i < n; i++) {
        const ckpt_tensor *t = &cat->tensors[sel[i]];
        for (size_t k = 0; t->ndim >= 2 && k < sizeof names / sizeof *names; k++)
            if (names[k].dt == t->dtype) bytes[k] += t->nbytes;
    }
    for (size_t k = 0; k < sizeof names / sizeof *names; k++)
        if (bytes[k] > most) most = bytes[k], ftype = names[k].ftype;
    return ftype;
}

/* Whether the gguf_kv document names key itself. */
static bool doc_has_key(const json_value *arr, const char *key) {
    for (const json_value *r = arr ? arr->head : NULL; r; r = r->next)
        if (r->type == JSON_ARRAY && r->count == 3 && json_str_eq(r->head, key)) return true;
    return false;
}

static void put_info(strbuf *f, const ckpt_tensor *t, uint64_t offset) {
    put_str(f, t->name, t->name_len);
    put_u32(f, t->ndim);
    for (uint32_t d = t->ndim; d-- > 0;) put_u64(f, t->shape[d]); /* ne[0] is the last dim */
    put_u32(f, (uint32_t)ggml_type_of(t->dtype));
    put_u64(f, offset);
}

/* Zeros for the padding parts of the layout: at most ALIGNMENT - 1 bytes each. */
static const unsigned char zeros[ALIGNMENT];

int gguf_layout_build(const ckpt_catalog *cat, const char *what, gguf_layout *L, ckpt_err *err) {
    memset(L, 0, sizeof *L);
    /* writer_select names the file in its messages: OUT, or the view's file name */
    const out_file named = {.final_path = (char *)what, .fd = -1};
    size_t *sel = NULL, n = 0;
    int rc = writer_select(&named, cat, check_tensor, "a GGUF file", &sel, &n, err);
    if (rc) return rc;
    int64_t source;
    kv_span *spans = NULL;
    size_t nspans = 0;
    src *s = NULL;
    strbuf h;
    sb_init(&h);
    if ((rc = find_gguf_source(cat, &source, err))) goto out;
    if (source >= 0) {
        if (!(s = calloc(1, sizeof *s))) {
            rc = ckpt_fail(err, -ENOMEM, "out of memory");
            goto out;
        }
        *s = (src){.cat = cat,
                   .source = (uint32_t)source,
                   .path = cat->sources[source].path,
                   .size = cat->sources[source].size,
                   .err = err};
        if ((rc = scan_kvs(s, &spans, &nspans))) goto out;
    }

    const ckpt_doc *kd = kv_doc(cat);
    json_doc kvs = {0};
    uint64_t nkv = 0;
    if (kd) {
        json_error jerr;
        if (json_parse(&kvs, kd->json, kd->len, &jerr) != 0) {
            rc = ckpt_fail(err, -EINVAL, "gguf_kv document: byte %zu: %s", jerr.pos, jerr.msg);
            goto out;
        }
        rc = kvs.root->type == JSON_ARRAY
                 ? put_doc_kvs(NULL, kvs.root, &nkv, err)
                 : ckpt_fail(err, -EINVAL, "gguf_kv document: not an array");
        if (rc) {
            json_doc_free(&kvs);
            goto out;
        }
    }
    /* A model laid out for llama.cpp (its KVs name an architecture) says what type its
     * matrices are in, as written (after --dtype), unless the document says it itself. */
    int64_t ftype = kd && doc_has_key(kvs.root, "general.architecture") &&
                            !doc_has_key(kvs.root, "general.file_type")
                        ? llama_file_type(cat, sel, n)
                        : -1;
    sb_put(&h, "GGUF", 4);
    put_u32(&h, 3);
    put_u64(&h, n);
    put_u64(&h, nspans + nkv + 2 + (ftype >= 0));
    for (size_t i = 0; i < nspans && !rc; i++) rc = copy_span(&h, s, spans[i]);
    if (!rc && kd) rc = put_doc_kvs(&h, kvs.root, &nkv, err);
    if (kd) json_doc_free(&kvs);
    if (rc) goto out;
    if (ftype >= 0) put_kv_u32(&h, "general.file_type", (uint32_t)ftype);
    put_kv_u32(&h, "general.alignment", ALIGNMENT);
    put_kv_str(&h, "ckptfs.source_format", cat->format ? cat->format : "unknown");
    uint64_t offset = 0;
    for (size_t i = 0; i < n; i++) {
        const ckpt_tensor *t = &cat->tensors[sel[i]];
        put_info(&h, t, offset);
        offset += t->nbytes + pad_to(t->nbytes);
    }
    sb_put(&h, zeros, (size_t)pad_to(h.len));
    if (h.failed) {
        rc = ckpt_fail(err, -ENOMEM, "out of memory");
        goto out;
    }
    L->header = sb_take(&h, &L->header_len);
    rc = ckpt_vfile_reserve(&L->vf, 1 + 2 * n) ||
                 ckpt_vfile_add_mem(&L->vf, L->header, L->header_len)
             ? -ENOMEM
             : 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const ckpt_tensor *t = &cat->tensors[sel[i]];
        uint64_t pad = pad_to(t->nbytes);
        if ((t->nbytes && ckpt_vfile_add_tensor(&L->vf, t, 0, t->nbytes)) ||
            (pad && ckpt_vfile_add_mem(&L->vf, zeros, pad)))
            rc = -ENOMEM;
    }
    if (rc) rc = ckpt_fail(err, -ENOMEM, "out of memory");
out:
    sb_free(&h);
    free(spans);
    free(s);
    free(sel);
    if (rc) gguf_layout_free(L);
    return rc;
}

void gguf_layout_free(gguf_layout *L) {
    ckpt_vfile_free(&L->vf);
    free(L->header);
    L->header = NULL;
    L->header_len = 0;
}
