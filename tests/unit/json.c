/* The strict JSON reader: exact integers, UTF-8, escapes, duplicates, depth, offsets. */
#include "util/json.h"
#include "tap.h"

#include <stdlib.h>

static int parse(const char *text, json_doc *doc, json_error *err) {
    return json_parse(doc, text, strlen(text), err);
}

static void refuses(const char *text, size_t len, const char *needle, size_t pos,
                    const char *what) {
    json_doc doc;
    json_error err;
    int rc = json_parse(&doc, text, len, &err);
    ok(rc != 0 && strstr(err.msg, needle) && err.pos == pos, "%s (\"%s\" at %zu)", what, err.msg,
       err.pos);
    if (!rc) json_doc_free(&doc);
}

/* The string scanner steps 16 or 8 bytes at a time: put each kind of stop byte at every offset
 * of the first blocks and check it is found exactly where it is. */
static void stops_at_every_offset(void) {
    int bad = 0;
    for (size_t k = 0; k < 48; k++) {
        char text[128];
        json_doc doc;
        json_error err;
        size_t n = 0;
        text[n++] = '"';
        for (size_t i = 0; i < k; i++) text[n++] = (char)('a' + i % 26);
        size_t at = n;
        /* a control byte, an invalid UTF-8 byte: refused at exactly 1 + k */
        const char *refused[] = {"\x01", "\xff"};
        for (int r = 0; r < 2; r++) {
            memcpy(text + at, refused[r], 1);
            memset(text + at + 1, 'z', 20);
            text[at + 21] = '"';
            if (json_parse(&doc, text, at + 22, &err) == 0) {
                json_doc_free(&doc);
                bad++;
            } else if (err.pos != at) {
                bad++;
            }
        }
        /* an escape and a 2-byte UTF-8 letter: decoded at k */
        memcpy(text + at, "\\n\xc3\xa9", 4);
        memset(text + at + 4, 'z', 20);
        text[at + 24] = '"';
        if (json_parse(&doc, text, at + 25, &err) != 0) {
            bad++;
            continue;
        }
        const json_value *v = doc.root;
        if (v->len != k + 23 || memcmp(v->str, text + 1, k) != 0 || v->str[k] != '\n' ||
            memcmp(v->str + k + 1, "\xc3\xa9", 2) != 0 || v->str[k + 3] != 'z')
            bad++;
        json_doc_free(&doc);
        /* the closing quote itself: the string ends there */
        text[at] = '"';
        int rc = json_parse(&doc, text, at + 1, &err);
        if (rc != 0 || doc.root->len != k) bad++;
        if (rc == 0) json_doc_free(&doc);
    }
    ok(bad == 0, "stop bytes at offsets 0..47 of a string are found where they are (%d wrong)",
       bad);
}

/* json_stream_members must refuse what json_parse refuses, with the same message at the same
 * offset, and hand over what it accepts member by member. */
typedef struct visit {
    char seen[256];
    size_t n;
    bool kept_whole;
} visit;

static int visit_member(void *ctx, const json_value *m) {
    visit *v = ctx;
    size_t room = sizeof v->seen - strlen(v->seen) - 1;
    strncat(v->seen, m->key, m->key_len < room ? m->key_len : room);
    strncat(v->seen, ";", room > m->key_len ? room - m->key_len : 0);
    v->n++;
    return 0;
}

static void streams_like_parse(const char *text, size_t expect_members) {
    json_doc a, b;
    json_error ea, eb;
    visit v = {0};
    int ra = json_parse(&a, text, strlen(text), &ea);
    int rb = json_stream_members(&b, text, strlen(text), "keep", visit_member, &v, &eb);
    bool same = ra == rb && (ra ? ea.pos == eb.pos && strcmp(ea.msg, eb.msg) == 0 : true);
    if (!ra && !rb && a.root->type == JSON_OBJECT) same = same && v.n == expect_members;
    ok(same, "stream = parse for %.40s (rc %d/%d, \"%s\" at %zu / \"%s\" at %zu, %zu members)",
       text, ra, rb, ra ? ea.msg : "", ea.pos, rb ? eb.msg : "", eb.pos, v.n);
    if (!ra) json_doc_free(&a);
    if (!rb) json_doc_free(&b);
}

static void streams(void) {
    streams_like_parse("{}", 0);
    streams_like_parse(" { \"a\" : 1 , \"b\":[1,2,{\"c\":null}]} ", 2);
    streams_like_parse("[1,2]", 0);
    streams_like_parse("\"x\"", 0);
    streams_like_parse("{\"a\":1,\"a\":2}", 0);
    streams_like_parse("{\"b\":1,\"a\":2,\"c\":3,\"a\":4,\"b\":5}", 0); /* earliest repeat */
    streams_like_parse("{\"a\":1,\"b\":2,\"a\":3,\"x\":[}", 0); /* syntax beats duplicates */
    streams_like_parse("{\"a\":{\"x\":1,\"x\":2},\"b\":[}", 0); /* nested: where it is */
    streams_like_parse("{\"a\":1,}", 0);
    streams_like_parse("{\"a\":1} x", 0);
    streams_like_parse("{\"a\" 1}", 0);
    streams_like_parse("{1:2}", 0);
    streams_like_parse("{\"a\":1", 0);
    streams_like_parse("{\"\\u0061\":1,\"a\":2}", 0);   /* escaped keys compare decoded */
    streams_like_parse("{\"a\\u0000b\":1,\"a\":2}", 2); /* NUL inside a name */
    streams_like_parse("{\"keep\":{\"k\":\"v\"},\"z\":18446744073709551615}", 2);
    /* The kept member survives its input, with its own copy of the text. */
    char *text = strdup("{\"a\":1,\"keep\":{\"k\":\"value\",\"n\":12}}");
    json_doc doc;
    json_error err;
    visit v = {0};
    int rc = json_stream_members(&doc, text, strlen(text), "keep", visit_member, &v, &err);
    memset(text, '#', strlen(text));
    free(text);
    const json_value *kept = rc ? NULL : json_member(doc.root, "keep");
    uint64_t n = 0;
    ok(kept && json_str_eq(json_member(kept, "k"), "value") &&
           json_as_u64(json_member(kept, "n"), &n) && n == 12 && doc.root->count == 1 &&
           strcmp(v.seen, "a;keep;") == 0,
       "the kept member outlives its input; every member was handed over (%s)", v.seen);
    if (!rc) json_doc_free(&doc);
}

int main(void) {
    json_doc doc;
    json_error err;
    ok(parse(" \t\n{\"a\": [1, 2.5, -3e2, true, false, null, \"x\"]} \r\n", &doc, &err) == 0,
       "surrounding whitespace and every value type");
    const json_value *a = json_member(doc.root, "a");
    ok(a && a->type == JSON_ARRAY && a->count == 7, "array has 7 members");
    uint64_t v;
    ok(json_as_u64(a->head, &v) && v == 1, "1 is an exact integer");
    ok(!json_as_u64(a->head->next, &v), "2.5 is not an integer");
    ok(!json_as_u64(a->head->next->next, &v), "-3e2 is not a u64");
    json_doc_free(&doc);

    ok(parse("[18446744073709551615, 18446744073709551616, 9007199254740993]", &doc, &err) == 0,
       "big integers parse");
    ok(json_as_u64(doc.root->head, &v) && v == UINT64_MAX, "2^64-1 kept exactly");
    ok(!json_as_u64(doc.root->head->next, &v), "2^64 does not fit");
    ok(json_as_u64(doc.root->head->next->next, &v) && v == 9007199254740993ull,
       "2^53+1 kept exactly (no double rounding)");
    json_doc_free(&doc);

    ok(parse("{\"k\\u0000\\n\\ud83d\\ude00\\/\": \"caf\xc3\xa9\"}", &doc, &err) == 0,
       "escapes, NUL, surrogate pair, raw UTF-8");
    const json_value *m = doc.root->head;
    ok(m->key_len == 8 && memcmp(m->key, "k\0\n\xf0\x9f\x98\x80", 7) == 0 && m->key[7] == '/',
       "escapes decode to the right bytes, NUL included");
    ok(m->len == 5 && memcmp(m->str, "caf\xc3\xa9", 5) == 0, "unescaped string points into input");
    json_doc_free(&doc);

    refuses("{\"a\":1,\"b\":2,\"a\":3}", 19, "duplicate", 13, "duplicate key found at its 2nd use");
    /* objects over 8 keys: sorted ones skip the hash set, which must not hide a repeat */
    char big[512];
    size_t at = 0;
    at += (size_t)snprintf(big + at, sizeof big - at, "{");
    for (int i = 0; i < 20; i++)
        at += (size_t)snprintf(big + at, sizeof big - at, "%s\"k%02d\":%d", i ? "," : "", i, i);
    snprintf(big + at, sizeof big - at, "}");
    ok(parse(big, &doc, &err) == 0 && doc.root->count == 20, "20 sorted keys");
    json_doc_free(&doc);
    refuses("{\"k00\":0,\"k01\":1,\"k02\":2,\"k03\":3,\"k04\":4,\"k05\":5,\"k05\":6,"
            "\"k07\":7,\"k08\":8,\"k09\":9}",
            81, "duplicate", 49, "sorted keys but one repeated next to itself");
    refuses("{\"k09\":0,\"k01\":1,\"k02\":2,\"k03\":3,\"k04\":4,\"k05\":5,\"k06\":6,"
            "\"k07\":7,\"k08\":8,\"k09\":9}",
            81, "duplicate", 73, "unsorted keys, the first one repeated last");
    ok(parse("{\"a\":0,\"ab\":1,\"abc\":2,\"abd\":3,\"b\":4,\"ba\":5,\"c\":6,\"d\":7,\"e\":8}",
             &doc, &err) == 0,
       "keys that are prefixes of the next are in order");
    json_doc_free(&doc);
    refuses("[1,2", 4, "truncated", 4, "truncated array");
    refuses("\"\xff\"", 3, "UTF-8", 1, "invalid UTF-8 byte");
    refuses("\"\xc0\xaf\"", 4, "UTF-8", 1, "overlong encoding");
    refuses("\"\xed\xa0\x80\"", 5, "UTF-8", 1, "encoded surrogate");
    refuses("\"\\ud800\"", 8, "surrogate", 1, "lone high surrogate escape");
    refuses("{} x", 4, "trailing", 3, "trailing characters");
    refuses("{}\0", 3, "trailing", 2, "NUL after the value");
    refuses("[01]", 4, "expected", 2, "leading zero");
    refuses("\"a\tb\"", 5, "control", 2, "raw tab inside a string");
    refuses("tru", 3, "literal", 0, "truncated literal");
    refuses("", 0, "end", 0, "empty input");

    size_t deep = 100000;
    char *text = malloc(2 * deep);
    memset(text, '[', deep);
    memset(text + deep, ']', deep);
    refuses(text, 2 * deep, "depth", 129, "100000-deep nesting stops at depth 128");
    memset(text, '[', 128);
    memset(text + 128, ']', 128);
    ok(json_parse(&doc, text, 256, &err) == 0, "128-deep nesting is fine");
    json_doc_free(&doc);
    free(text);
    stops_at_every_offset();
    streams();
    return tap_done();
}
