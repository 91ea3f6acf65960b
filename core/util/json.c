#include "json.h"

#include "grow.h"
#include "hashmap.h"
#include "utf8.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

typedef struct parser {
    const char *buf;
    size_t len;
    size_t pos;
    arena *mem;    /* where values go: the document's, or a member's scratch */
    bool own_text; /* strings and numbers are copied into mem, not pointed to in buf */
    json_error *err;
    int rc;
    size_t values_left; /* JSON_DENSITY's budget, in values */
} parser;

static int fail(parser *p, size_t pos, const char *msg) {
    if (p->rc == 0) {
        p->rc = -EINVAL;
        p->err->pos = pos;
        snprintf(p->err->msg, sizeof p->err->msg, "%s", msg);
    }
    return p->rc;
}

static int oom(parser *p) {
    if (p->rc == 0) {
        p->rc = -ENOMEM;
        p->err->pos = p->pos;
        snprintf(p->err->msg, sizeof p->err->msg, "out of memory");
    }
    return p->rc;
}

static void skip_ws(parser *p) {
    while (p->pos < p->len) {
        char c = p->buf[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static json_value *new_value(parser *p, json_type t) {
    if (!p->values_left) {
        if (p->rc == 0) {
            p->rc = -E2BIG;
            p->err->pos = p->pos;
            snprintf(p->err->msg, sizeof p->err->msg,
                     "too many values for %zu bytes: they would take more than %d times the "
                     "document's size in memory",
                     p->len, JSON_DENSITY);
        }
        return NULL;
    }
    p->values_left--;
    json_value *v = arena_alloc(p->mem, sizeof *v);
    if (!v) {
        oom(p);
        return NULL;
    }
    v->type = (uint8_t)t;
    v->pos = p->pos;
    return v;
}

static int hex4(parser *p, size_t at, unsigned *out) {
    if (p->len - at < 4) return fail(p, at, "truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p->buf[at + (size_t)i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return fail(p, at, "bad hex digit in \\u escape");
    }
    *out = v;
    return 0;
}

static size_t put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Bytes a string scan must stop at: '"', '\\', controls (< 0x20) and non-ASCII (>= 0x80, whose
 * UTF-8 is checked). Returns how many plain bytes start b[0..n). Headers are mostly long names,
 * so this runs 16 (SSE2) or 8 bytes per step. */
static size_t plain_run(const char *b, size_t n) {
    size_t i = 0;
#ifdef __SSE2__
    const __m128i quote = _mm_set1_epi8('"'), slash = _mm_set1_epi8('\\'),
                  space = _mm_set1_epi8(0x20);
    for (; n - i >= 16; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(b + i));
        /* Signed compare: bytes >= 0x80 are negative, so "< 0x20" catches them too. */
        __m128i stop =
            _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, slash)),
                         _mm_cmplt_epi8(v, space));
        unsigned mask = (unsigned)_mm_movemask_epi8(stop);
        if (mask) return i + (size_t)__builtin_ctz(mask);
    }
#endif
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    for (; n - i >= 8; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        uint64_t q = w ^ (ones * '"'), s = w ^ (ones * '\\');
        /* Borrows only run upwards, so the lowest flagged byte is a real stop. */
        uint64_t stop = (((q - ones) & ~q) | ((s - ones) & ~s) | (w - ones * 0x20) | w) & highs;
        if (stop) return i + (size_t)__builtin_ctzll(stop) / 8;
    }
    while (i < n && b[i] != '"' && b[i] != '\\' && (unsigned char)b[i] >= 0x20 &&
           (unsigned char)b[i] < 0x80)
        i++;
    return i;
}

/* Parses a string at p->pos (the opening quote). Unescaped strings are not copied. */
static int parse_string(parser *p, const char **out, size_t *out_len) {
    size_t start = ++p->pos;
    bool escaped = false;
    while (p->pos < p->len) {
        p->pos += plain_run(p->buf + p->pos, p->len - p->pos);
        if (p->pos >= p->len) break;
        unsigned char c = (unsigned char)p->buf[p->pos];
        if (c == '"') break;
        if (c == '\\') {
            escaped = true;
            p->pos += 2;
            continue;
        }
        if (c < 0x20) return fail(p, p->pos, "control character in string");
        size_t k = utf8_seq_len((const unsigned char *)p->buf + p->pos, p->len - p->pos);
        if (!k) return fail(p, p->pos, "invalid UTF-8 in string");
        p->pos += k;
    }
    if (p->pos >= p->len) return fail(p, start - 1, "unterminated string");
    size_t end = p->pos++;
    if (!escaped && p->own_text) {
        char *o = arena_memdup(p->mem, p->buf + start, end - start);
        if (!o) return oom(p);
        *out = o;
        *out_len = end - start;
        return 0;
    }
    if (!escaped) {
        *out = p->buf + start;
        *out_len = end - start;
        return 0;
    }
    /* Decoding never grows the text: every escape is at least as long as its UTF-8 form. */
    char *o = arena_alloc(p->mem, end - start + 1);
    if (!o) return oom(p);
    size_t n = 0;
    for (size_t i = start; i < end;) {
        if (p->buf[i] != '\\') {
            /* Copy up to the next escape in one go: an escaped JSON document inside a string
             * (DCP_SHARDING_INFO) has one every few bytes, a long name none. */
            const char *next = memchr(p->buf + i, '\\', end - i);
            size_t run = next ? (size_t)(next - (p->buf + i)) : end - i;
            memcpy(o + n, p->buf + i, run);
            n += run;
            i += run;
            continue;
        }
        char e = p->buf[i + 1];
        i += 2;
        switch (e) {
        case '"':
            o[n++] = '"';
            break;
        case '\\':
            o[n++] = '\\';
            break;
        case '/':
            o[n++] = '/';
            break;
        case 'b':
            o[n++] = '\b';
            break;
        case 'f':
            o[n++] = '\f';
            break;
        case 'n':
            o[n++] = '\n';
            break;
        case 'r':
            o[n++] = '\r';
            break;
        case 't':
            o[n++] = '\t';
            break;
        case 'u': {
            unsigned cp;
            if (hex4(p, i, &cp)) return p->rc;
            i += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return fail(p, i - 6, "lone low surrogate");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned lo;
                if (i + 2 > end || p->buf[i] != '\\' || p->buf[i + 1] != 'u')
                    return fail(p, i - 6, "lone high surrogate");
                if (hex4(p, i + 2, &lo)) return p->rc;
                if (lo < 0xDC00 || lo > 0xDFFF) return fail(p, i, "bad low surrogate");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                i += 6;
            }
            n += put_utf8(o + n, cp);
            break;
        }
        default:
            return fail(p, i - 2, "invalid escape in string");
        }
    }
    o[n] = '\0';
    *out = o;
    *out_len = n;
    return 0;
}

static int parse_number(parser *p, json_value *v) {
    size_t s = p->pos, i = s;
    const char *b = p->buf;
    if (i < p->len && b[i] == '-') i++;
    if (i >= p->len) return fail(p, s, "truncated number");
    if (b[i] == '0') {
        i++;
    } else if (b[i] >= '1' && b[i] <= '9') {
        while (i < p->len && b[i] >= '0' && b[i] <= '9') i++;
    } else {
        return fail(p, s, "invalid number");
    }
    if (i < p->len && b[i] == '.') {
        i++;
        size_t d = i;
        while (i < p->len && b[i] >= '0' && b[i] <= '9') i++;
        if (i == d) return fail(p, s, "invalid number");
    }
    if (i < p->len && (b[i] == 'e' || b[i] == 'E')) {
        i++;
        if (i < p->len && (b[i] == '+' || b[i] == '-')) i++;
        size_t d = i;
        while (i < p->len && b[i] >= '0' && b[i] <= '9') i++;
        if (i == d) return fail(p, s, "invalid number");
    }
    v->str = b + s;
    if (p->own_text && !(v->str = arena_memdup(p->mem, b + s, i - s))) return oom(p);
    v->len = (uint32_t)(i - s);
    p->pos = i;
    return 0;
}

static int duplicate(parser *p, const json_value *later) {
    char msg[120];
    snprintf(msg, sizeof msg, "duplicate key \"%.*s\"",
             (int)(later->key_len > 60 ? 60 : later->key_len), later->key);
    return fail(p, later->pos, msg);
}

static bool same_key(const json_value *a, const json_value *b) {
    return a->key_len == b->key_len && memcmp(a->key, b->key, a->key_len) == 0;
}

static int key_order(const json_value *a, const json_value *b) {
    size_t n = a->key_len < b->key_len ? a->key_len : b->key_len;
    int c = memcmp(a->key, b->key, n);
    return c ? c : (a->key_len > b->key_len) - (a->key_len < b->key_len);
}

/* Pairwise for the small objects a header is made of (a tensor entry has three keys), a hash
 * set for large ones unless the keys are strictly increasing (an HF index's weight_map is
 * written sorted); members come in document order, so the one found second is the later. */
static int check_duplicates(parser *p, json_value *obj) {
    if (obj->count < 2) return 0;
    if (obj->count <= 8) {
        for (const json_value *m = obj->head->next; m; m = m->next)
            for (const json_value *e = obj->head; e != m; e = e->next)
                if (same_key(e, m)) return duplicate(p, m);
        return 0;
    }
    const json_value *run = obj->head;
    while (run->next && key_order(run, run->next) < 0) run = run->next;
    if (!run->next) return 0;
    hashmap seen;
    if (!hm_init(&seen, obj->count)) return oom(p);
    int rc = 0;
    for (const json_value *m = obj->head; m && !rc; m = m->next) {
        bool added;
        if (!hm_put(&seen, m->key, m->key_len, 0, &added))
            rc = oom(p);
        else if (!added)
            rc = duplicate(p, m);
    }
    hm_free(&seen);
    return rc;
}

static int parse_value(parser *p, json_value **out, int depth);

static int parse_container(parser *p, json_value *v, int depth) {
    bool is_obj = v->type == JSON_OBJECT;
    char close = is_obj ? '}' : ']';
    p->pos++;
    skip_ws(p);
    if (p->pos < p->len && p->buf[p->pos] == close) {
        p->pos++;
        return 0;
    }
    json_value **tail = &v->head;
    for (;;) {
        const char *key = NULL;
        size_t key_len = 0;
        skip_ws(p);
        size_t key_pos = p->pos;
        if (is_obj) {
            if (p->pos >= p->len) return fail(p, p->pos, "truncated object");
            if (p->buf[p->pos] != '"') return fail(p, p->pos, "expected a string key");
            if (parse_string(p, &key, &key_len)) return p->rc;
            skip_ws(p);
            if (p->pos >= p->len || p->buf[p->pos] != ':')
                return fail(p, p->pos, "expected ':' after key");
            p->pos++;
        }
        json_value *m;
        if (parse_value(p, &m, depth + 1)) return p->rc;
        m->key = key;
        m->key_len = (uint32_t)key_len;
        if (is_obj) m->pos = key_pos;
        *tail = m;
        tail = &m->next;
        if (v->count == UINT32_MAX) return fail(p, p->pos, "too many members");
        v->count++;
        skip_ws(p);
        if (p->pos >= p->len)
            return fail(p, p->pos, is_obj ? "truncated object" : "truncated array");
        char c = p->buf[p->pos++];
        if (c == close) break;
        if (c != ',')
            return fail(p, p->pos - 1, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
    return is_obj ? check_duplicates(p, v) : 0;
}

static int parse_value(parser *p, json_value **out, int depth) {
    if (depth > JSON_MAX_DEPTH) return fail(p, p->pos, "nesting depth exceeds 128");
    skip_ws(p);
    if (p->pos >= p->len) return fail(p, p->pos, "unexpected end of JSON");
    char c = p->buf[p->pos];
    json_value *v;
    switch (c) {
    case '{':
    case '[':
        if (!(v = new_value(p, c == '{' ? JSON_OBJECT : JSON_ARRAY))) return p->rc;
        if (parse_container(p, v, depth)) return p->rc;
        break;
    case '"': {
        size_t n;
        if (!(v = new_value(p, JSON_STRING))) return p->rc;
        if (parse_string(p, &v->str, &n)) return p->rc;
        v->len = (uint32_t)n;
        break;
    }
    case 't':
    case 'f':
    case 'n': {
        static const struct {
            const char *word;
            json_type type;
        } words[] = {{"true", JSON_TRUE}, {"false", JSON_FALSE}, {"null", JSON_NULL}};
        size_t w = c == 't' ? 0 : c == 'f' ? 1 : 2;
        size_t n = strlen(words[w].word);
        if (p->len - p->pos < n || memcmp(p->buf + p->pos, words[w].word, n) != 0)
            return fail(p, p->pos, "invalid literal");
        if (!(v = new_value(p, words[w].type))) return p->rc;
        p->pos += n;
        break;
    }
    default:
        if (c != '-' && (c < '0' || c > '9')) {
            if (c == '\0') return fail(p, p->pos, "NUL byte where a JSON value was expected");
            return fail(p, p->pos, "unexpected character");
        }
        if (!(v = new_value(p, JSON_NUMBER))) return p->rc;
        if (parse_number(p, v)) return p->rc;
        break;
    }
    *out = v;
    return 0;
}

/* An upper bound of the values in buf, exact for valid JSON: every value opens its document
 * or a container, or follows a comma. Strings are skipped whole (commas and brackets in names
 * are not structure). Cheap next to parsing: memchr-driven, nothing allocated. */
static size_t count_values(const char *buf, size_t len) {
    size_t n = 1;
    for (size_t i = 0; i < len; i++) {
        char c = buf[i];
        if (c == ',' || c == '[' || c == '{') {
            n++;
        } else if (c == '"') {
            for (i++; i < len; i++) {
                const char *q = memchr(buf + i, '"', len - i);
                if (!q) return n;
                i = (size_t)(q - buf);
                size_t slashes = 0;
                while (slashes < i && buf[i - 1 - slashes] == '\\') slashes++;
                if (slashes % 2 == 0) break;
            }
        }
    }
    return n;
}

/* The value budget of JSON_DENSITY; a large document too dense to parse is refused before
 * anything is allocated (returns false with the error set). */
static bool within_density(parser *p) {
    p->values_left = (JSON_DENSITY * p->len + JSON_SLACK) / sizeof(json_value);
    if (p->len > JSON_SLACK && count_values(p->buf, p->len) > p->values_left) {
        p->values_left = 0;
        new_value(p, JSON_NULL); /* fails, with the message */
        p->err->pos = 0;
        return false;
    }
    return true;
}

static int start(json_doc *doc, size_t len, json_error *err) {
    arena_init(&doc->mem);
    doc->root = NULL;
    err->pos = 0;
    err->msg[0] = '\0';
    if (len >= UINT32_MAX) { /* offsets and lengths are kept in 32 bits */
        snprintf(err->msg, sizeof err->msg, "JSON of %zu bytes: the limit is 4 GiB", len);
        return -E2BIG;
    }
    return 0;
}

int json_parse(json_doc *doc, const char *buf, size_t len, json_error *err) {
    int rc = start(doc, len, err);
    if (rc) return rc;
    parser p = {.buf = buf, .len = len, .mem = &doc->mem, .err = err};
    if (!within_density(&p)) return p.rc;
    json_value *root;
    if (parse_value(&p, &root, 0) == 0) {
        skip_ws(&p);
        if (p.pos != len) fail(&p, p.pos, "trailing characters after JSON value");
    }
    if (p.rc) {
        json_doc_free(doc);
        return p.rc;
    }
    doc->root = root;
    return 0;
}

/* A key of the root object, for the duplicate check at its end. */
typedef struct key_ref {
    const char *key;
    uint32_t len;
    uint32_t pos;
} key_ref;

static int key_cmp(const key_ref *x, const key_ref *y) {
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->key, y->key, n);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* By key, then by place in the document. */
static int key_ref_order(const void *a, const void *b) {
    const key_ref *x = a, *y = b;
    int c = key_cmp(x, y);
    return c ? c : (x->pos > y->pos) - (x->pos < y->pos);
}

/* The root's duplicate keys, as check_duplicates finds them in a DOM: the member reported is
 * the earliest in the document whose key came before. Keys in increasing order (an index's
 * weight_map, most headers) need no sort. */
static int check_root_duplicates(parser *p, key_ref *keys, size_t n) {
    size_t run = 1;
    while (run < n && key_cmp(&keys[run - 1], &keys[run]) < 0) run++;
    if (run >= n) return 0;
    qsort(keys, n, sizeof *keys, key_ref_order);
    const key_ref *later = NULL;
    for (size_t i = 1; i < n; i++) {
        if (key_cmp(&keys[i - 1], &keys[i]) != 0) continue;
        /* The group's second is its earliest repeat. */
        if (!later || keys[i].pos < later->pos) later = &keys[i];
        while (i + 1 < n && key_cmp(&keys[i], &keys[i + 1]) == 0) i++;
    }
    if (!later) return 0;
    json_value v = {.key = later->key, .key_len = later->len, .pos = later->pos};
    return duplicate(p, &v);
}

static int stream_members(parser *p, json_doc *doc, const char *keep, json_member_fn each,
                          void *ctx) {
    json_value *root = new_value(p, JSON_OBJECT);
    if (!root) return p->rc;
    doc->root = root;
    arena scratch, keys_mem;
    arena_init(&scratch);
    arena_init(&keys_mem);
    key_ref *keys = NULL;
    size_t nkeys = 0, cap = 0;
    json_value **kept_tail = &root->head;
    size_t keep_len = keep ? strlen(keep) : 0;
    p->pos++;
    skip_ws(p);
    bool empty = p->pos < p->len && p->buf[p->pos] == '}';
    if (empty) p->pos++;
    while (!empty && !p->rc) {
        skip_ws(p);
        size_t key_pos = p->pos;
        if (p->pos >= p->len) {
            fail(p, p->pos, "truncated object");
            break;
        }
        if (p->buf[p->pos] != '"') {
            fail(p, p->pos, "expected a string key");
            break;
        }
        const char *key;
        size_t key_len;
        p->mem = &keys_mem; /* a key with escapes is decoded there and outlives its member */
        if (parse_string(p, &key, &key_len)) break;
        skip_ws(p);
        if (p->pos >= p->len || p->buf[p->pos] != ':') {
            fail(p, p->pos, "expected ':' after key");
            break;
        }
        p->pos++;
        bool kept = keep && key_len == keep_len && memcmp(key, keep, keep_len) == 0;
        arena_reset(&scratch);
        p->mem = kept ? &doc->mem : &scratch;
        p->own_text = kept;
        json_value *m;
        int value_rc = parse_value(p, &m, 1);
        p->own_text = false;
        if (value_rc) break;
        if (kept && !(key = arena_memdup(&doc->mem, key, key_len))) {
            oom(p);
            break;
        }
        m->key = key;
        m->key_len = (uint32_t)key_len;
        m->pos = key_pos;
        if (nkeys == UINT32_MAX) {
            fail(p, p->pos, "too many members");
            break;
        }
        if (GROW(keys, cap, nkeys + 1)) {
            oom(p);
            break;
        }
        keys[nkeys++] = (key_ref){key, (uint32_t)key_len, (uint32_t)key_pos};
        if (kept) {
            *kept_tail = m;
            kept_tail = &m->next;
            root->count++;
        }
        int rc = each(ctx, m);
        if (rc) {
            p->rc = rc; /* the reader's own error: it has said why */
            break;
        }
        skip_ws(p);
        if (p->pos >= p->len) {
            fail(p, p->pos, "truncated object");
            break;
        }
        char c = p->buf[p->pos++];
        if (c == '}') break;
        if (c != ',') fail(p, p->pos - 1, "expected ',' or '}'");
    }
    if (!p->rc) {
        skip_ws(p);
        if (p->pos != p->len) fail(p, p->pos, "trailing characters after JSON value");
    }
    if (!p->rc) check_root_duplicates(p, keys, nkeys);
    free(keys);
    arena_free(&scratch);
    arena_free(&keys_mem);
    return p->rc;
}

int json_stream_members(json_doc *doc, const char *buf, size_t len, const char *keep,
                        json_member_fn each, void *ctx, json_error *err) {
    int rc = start(doc, len, err);
    if (rc) return rc;
    size_t at = 0;
    while (at < len && (buf[at] == ' ' || buf[at] == '\t' || buf[at] == '\n' || buf[at] == '\r'))
        at++;
    if (at >= len || buf[at] != '{') return json_parse(doc, buf, len, err);
    parser p = {.buf = buf, .len = len, .pos = at, .mem = &doc->mem, .err = err};
    if (!within_density(&p)) return p.rc;
    if (stream_members(&p, doc, keep, each, ctx)) {
        json_doc_free(doc);
        return p.rc;
    }
    return 0;
}

void json_doc_free(json_doc *doc) {
    arena_free(&doc->mem);
    doc->root = NULL;
}

const char *json_type_name(json_type t) {
    static const char *names[] = {"null", "false", "true", "number", "string", "array", "object"};
    return (unsigned)t < sizeof names / sizeof *names ? names[t] : "?";
}

const char *json_type_desc(json_type t) {
    static const char *names[] = {"null",     "false",    "true",     "a number",
                                  "a string", "an array", "an object"};
    return (unsigned)t < sizeof names / sizeof *names ? names[t] : "?";
}

const json_value *json_member(const json_value *obj, const char *key) {
    if (!obj || obj->type != JSON_OBJECT) return NULL;
    size_t n = strlen(key);
    for (const json_value *m = obj->head; m; m = m->next)
        if (m->key_len == n && memcmp(m->key, key, n) == 0) return m;
    return NULL;
}

bool json_as_u64(const json_value *v, uint64_t *out) {
    if (!v || v->type != JSON_NUMBER || v->len == 0) return false;
    uint64_t r = 0;
    for (size_t i = 0; i < v->len; i++) {
        char c = v->str[i];
        if (c < '0' || c > '9') return false; /* sign, fraction or exponent */
        unsigned d = (unsigned)(c - '0');
        if (r > (UINT64_MAX - d) / 10) return false;
        r = r * 10 + d;
    }
    *out = r;
    return true;
}

bool json_str_eq(const json_value *v, const char *s) {
    size_t n = strlen(s);
    return v && v->type == JSON_STRING && v->len == n && memcmp(v->str, s, n) == 0;
}
