/* The strict JSON reader: exact integers, UTF-8, escapes, duplicates, depth, offsets. */
#include "json.h"
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
    return tap_done();
}
