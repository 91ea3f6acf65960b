/* The unpickler's first pass (which memo entries are fetched, so which values are shared) and
 * its hook (pk_hooks.on_pair): values swapped for records, what they held recycled, shared
 * values never offered, a hook's error stopping the parse. Opcode streams are hand-assembled
 * from CPython's pickletools table. */
#include "parse/pickle.h"
#include "tap.h"

#include <string.h>

static const pk_options plain = {"hooks.pkl", 0, &pk_torch_globals, 1, {0, 0, 0}, NULL};

#define LIT(s) s, sizeof s - 1

static void test_shared_flags(void) {
    /* (L, L, M, D, D) with L = [] memoized at 0 and fetched, M = [] memoized at 1 and never
     * fetched, D = {} pushed twice by DUP. */
    static const char p[] = "\x80\x02(]q\x00h\x00]q\x01}2t.";
    pk_doc doc;
    ckpt_err err = {{0}};
    int rc = pk_parse(&doc, LIT(p), &plain, &err);
    ok(rc == 0, "memo and DUP sample parses (%s)", err.msg);
    if (rc) return;
    pk_value *const *it = doc.root->u.c.items;
    ok(doc.root->n == 5 && it[0] == it[1] && pk_shared(it[0]), "a fetched memo entry is shared");
    ok(!pk_shared(it[2]), "a memo entry nobody fetches leaves its value unshared");
    ok(it[3] == it[4] && pk_shared(it[3]), "DUP shares its value");
    ok(!pk_shared(doc.root), "the tuple itself has one owner");
    pk_free(&doc);

    /* Without a STOP the first pass cannot tell: the parse fails as it always did. */
    static const char q[] = "\x80\x02]q\x00h\x00h\x07";
    rc = pk_parse(&doc, LIT(q), &plain, &err);
    ok(rc == -EINVAL && strstr(err.msg, "memo index 7 was never stored"),
       "a GET of an index never stored is refused by name (%s)", err.msg);
    rc = pk_parse(&doc, "\x80\x02]q\x00h\x00", 7, &plain, &err);
    ok(rc == PK_ETRUNC, "a pickle without STOP is truncated (%s)", err.msg);
}

typedef struct counter {
    int offered, swapped;
    int fail_at; /* the offer that fails, or 0 */
} counter;

/* Swaps list values for records tagged with their length; fails at the fail_at-th offer. */
static int swap_lists(void *ctx, pk_doc *doc, const pk_pair_site *site, pk_value **key,
                      pk_value **value, ckpt_err *err) {
    counter *c = ctx;
    c->offered++;
    if (c->fail_at && c->offered == c->fail_at)
        return ckpt_fail(err, -EINVAL, "hook refuses pair %d under \"%.*s\"", c->offered,
                         (int)(*key)->u.s.len, (*key)->u.s.p);
    if (site->dict->kind != PK_DICT || (*value)->kind != PK_LIST) return 0;
    pk_value *rec = pk_new_record(doc, 7, NULL, (*value)->pos);
    if (!rec) return ckpt_fail(err, -ENOMEM, "out of memory");
    rec->n = 7;
    *value = rec;
    c->swapped++;
    return 0;
}

static void test_hook(void) {
    /* {"a": [1, 2], "b": [3], "c": 4, "s": L, "t": L} where L = [5] is memoized and fetched. */
    static const char p[] = "\x80\x02}("
                            "X\x01\x00\x00\x00"
                            "a](K\x01K\x02"
                            "e"
                            "X\x01\x00\x00\x00"
                            "b]K\x03"
                            "a"
                            "X\x01\x00\x00\x00"
                            "cK\x04"
                            "X\x01\x00\x00\x00"
                            "s]q\x00K\x05"
                            "a"
                            "X\x01\x00\x00\x00"
                            "th\x00"
                            "u.";
    counter c = {0, 0, 0};
    pk_hooks hooks = {&c, swap_lists};
    pk_options o = plain;
    o.hooks = &hooks;
    pk_doc doc;
    ckpt_err err = {{0}};
    int rc = pk_parse(&doc, LIT(p), &o, &err);
    ok(rc == 0, "a dict parses with a hook (%s)", err.msg);
    if (rc) return;
    const pk_value *a = pk_dict_get(doc.root, "a"), *b = pk_dict_get(doc.root, "b"),
                   *cc = pk_dict_get(doc.root, "c"), *s = pk_dict_get(doc.root, "s");
    ok(c.offered == 3, "the three unshared values are offered, the shared list is not (%d)",
       c.offered);
    ok(c.swapped == 2 && a && a->kind == PK_RECORD && a->n == 7 && b && b->kind == PK_RECORD,
       "both unshared lists became records");
    ok(a && a->pos == 10, "a record carries the offset of what it stands for (%llu)",
       a ? (unsigned long long)a->pos : 0ull);
    ok(cc && cc->kind == PK_INT && cc->u.i == 4, "a value the hook keeps stays");
    ok(s && s->kind == PK_LIST && s->n == 1 && s == pk_dict_get(doc.root, "t"),
       "the shared list stays, seen from both keys");
    ok(doc.spare_values != NULL, "what the swapped lists held was recycled");
    size_t values = doc.values;
    pk_free(&doc);

    /* The values a pickle holds count the same with or without a hook (the limits see the
     * same pickle). */
    rc = pk_parse(&doc, LIT(p), &plain, &err);
    ok(rc == 0 && doc.values == values, "values counted alike with and without the hook");
    if (!rc) pk_free(&doc);

    /* A hook's error stops the parse with its message. */
    c = (counter){0, 0, 2};
    rc = pk_parse(&doc, LIT(p), &o, &err);
    ok(rc == -EINVAL && strstr(err.msg, "hook refuses pair 2 under \"b\""),
       "a hook's error stops the parse (%s)", err.msg);
}

/* A list of 20 small tuples, each in a one-pair dict that the hook empties: the nodes of one
 * tuple are reused for the next, so the document does not grow with the list. */
static void test_recycling(void) {
    char p[2048];
    size_t n = 0;
    memcpy(p + n, "\x80\x02](", 4);
    n += 4;
    for (int i = 0; i < 20; i++) {
        /* {"k": [i, i, i]} */
        static const char one[] = "}X\x01\x00\x00\x00k](K\x00K\x00K\x00"
                                  "es";
        memcpy(p + n, one, sizeof one - 1);
        n += sizeof one - 1;
    }
    memcpy(p + n, "e.", 2);
    n += 2;
    counter c = {0, 0, 0};
    pk_hooks hooks = {&c, swap_lists};
    pk_options o = plain;
    o.hooks = &hooks;
    pk_doc doc;
    ckpt_err err = {{0}};
    int rc = pk_parse(&doc, p, n, &o, &err);
    ok(rc == 0 && doc.root->n == 20 && c.swapped == 20, "20 dicts, 20 lists swapped (%s)", err.msg);
    size_t spare = 0;
    for (const pk_value *v = doc.spare_values; v && spare < 1000; v = v->u.persid) spare++;
    ok(spare > 0 && spare < 8,
       "recycled nodes are reused: %zu spare at the end, not 20 lists' worth", spare);
    if (!rc) pk_free(&doc);
}

int main(void) {
    test_shared_flags();
    test_hook();
    test_recycling();
    return tap_done();
}
