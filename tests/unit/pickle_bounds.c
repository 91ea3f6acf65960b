/* The restricted unpickler's length, count and limit checks, each at exactly its bound, one under
 * and one over (opcode bytes from CPython's pickletools table). Where the accepted side of a bound
 * cannot end in a STOP (an operand that reaches the end of the pickle), it is refused by the next
 * check, and the message shows which check that was. */
#include "parse/pickle.h"
#include "tap.h"

#include <stdint.h>
#include <stdlib.h>

static int parse_with(pk_doc *doc, const void *data, size_t len, pk_limits lim, ckpt_err *err) {
    pk_options o = {"bound.pkl", 0, &pk_torch_globals, 1, lim, NULL};
    return pk_parse(doc, data, len, &o, err);
}

/* Parses data[0, len) with limits lim; wants success (needle NULL) or a refusal naming needle. */
static void expect(const char *what, const void *data, size_t len, pk_limits lim,
                   const char *needle) {
    pk_doc doc;
    ckpt_err err = {{0}};
    int rc = parse_with(&doc, data, len, lim, &err);
    if (!needle)
        ok(rc == 0, "%s parses", what);
    else
        ok(rc != 0 && strstr(err.msg, needle) != NULL, "%s is refused, naming \"%s\"", what,
           needle);
    if (rc == 0)
        pk_free(&doc);
    else if (!needle || !strstr(err.msg, needle))
        printf("#   rc %d: %s\n", rc, err.msg);
}

#define NO_LIMITS ((pk_limits){0, 0, 0})
#define EXPECT(what, lit, needle) expect(what, lit, sizeof lit - 1, NO_LIMITS, needle)

/* An operand that ends exactly at the end of the pickle is read (then the STOP is missing); one
 * byte short, it is not. */
static void test_operands(void) {
    EXPECT("BININT ending at the end", "\x80\x02J\x01\x00\x00\x00", "without a STOP");
    EXPECT("BININT one byte short", "\x80\x02J\x01\x00\x00", "needs 4 more bytes");
    EXPECT("SHORT_BINUNICODE 3 with 3 bytes left",
           "\x80\x02\x8c\x03"
           "abc",
           "without a STOP");
    EXPECT("SHORT_BINUNICODE 4 with 3 bytes left",
           "\x80\x02\x8c\x04"
           "abc",
           "runs past the end");
    EXPECT("BINUNICODE 3 with 3 bytes left",
           "\x80\x02X\x03\x00\x00\x00"
           "abc",
           "without a STOP");
    EXPECT("BINUNICODE 4 with 3 bytes left",
           "\x80\x02X\x04\x00\x00\x00"
           "abc",
           "runs past the end");
    EXPECT("LONG1 2 with 2 bytes left", "\x80\x02\x8a\x02\x01\x02", "without a STOP");
    EXPECT("LONG1 3 with 2 bytes left", "\x80\x02\x8a\x03\x01\x02", "runs past the end");
    EXPECT("FRAME of the 2 bytes left", "\x80\x04\x95\x02\x00\x00\x00\x00\x00\x00\x00N.", NULL);
    EXPECT("FRAME of 3 with 2 bytes left", "\x80\x04\x95\x03\x00\x00\x00\x00\x00\x00\x00N.",
           "frame of 3 bytes");
    EXPECT("protocol 5", "\x80\x05N.", NULL);
    EXPECT("protocol 6", "\x80\x06N.", "protocol 6");
}

/* LONG1 values of 7, 8 and 9 bytes: int64 while the bytes past the 8th repeat the sign. */
static void test_long_widths(void) {
    static const struct {
        const char *what, *bytes;
        size_t n;
        int kind;
        int64_t value;
    } cases[] = {
        {"7 bytes, -2", "\xfe\xff\xff\xff\xff\xff\xff", 7, PK_INT, -2},
        {"8 bytes, INT64_MIN", "\x00\x00\x00\x00\x00\x00\x00\x80", 8, PK_INT, INT64_MIN},
        {"8 bytes, INT64_MAX", "\xff\xff\xff\xff\xff\xff\xff\x7f", 8, PK_INT, INT64_MAX},
        {"9 bytes, -2 (sign repeated)", "\xfe\xff\xff\xff\xff\xff\xff\xff\xff", 9, PK_INT, -2},
        {"9 bytes, 2^63 (too big)", "\x00\x00\x00\x00\x00\x00\x00\x80\x00", 9, PK_BIGINT, 0},
        {"9 bytes, -2^63-1 (too small)", "\xff\xff\xff\xff\xff\xff\xff\x7f\xff", 9, PK_BIGINT, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        unsigned char buf[32] = {0x80, 0x02, 0x8a};
        buf[3] = (unsigned char)cases[i].n;
        memcpy(buf + 4, cases[i].bytes, cases[i].n);
        buf[4 + cases[i].n] = '.';
        pk_doc doc;
        ckpt_err err = {{0}};
        int rc = parse_with(&doc, buf, 5 + cases[i].n, NO_LIMITS, &err);
        const pk_value *v = rc ? NULL : doc.root;
        bool good =
            v && v->kind == cases[i].kind && (cases[i].kind != PK_INT || v->u.i == cases[i].value);
        ok(good, "LONG1 of %s", cases[i].what);
        if (!good && v) printf("#   kind %d value %lld\n", v->kind, (long long)v->u.i);
        if (!rc) pk_free(&doc);
    }
}

/* The memo holds indexes up to the pickle's length (no honest writer reaches it), and a get
 * reads only what was stored. */
static void test_memo(void) {
    /* 15 bytes: PROTO 2, NONE, LONG_BINPUT idx, POP, LONG_BINGET idx, STOP. */
    for (uint32_t idx = 15; idx <= 16; idx++) {
        unsigned char p[] = {0x80, 0x02, 'N', 'r', 0, 0, 0, 0, '0', 'j', 0, 0, 0, 0, '.'};
        memcpy(p + 4, &idx, 4);
        memcpy(p + 10, &idx, 4);
        char what[80];
        snprintf(what, sizeof what, "memo index %u in a 15-byte pickle", idx);
        expect(what, p, sizeof p, NO_LIMITS, idx == 15 ? NULL : "memo index 16 is beyond");
    }
    unsigned char q[] = {0x80, 0x02, 'N', 'q', 3, '0', 'h', 2, '.'};
    expect("BINGET of an index below the stored one", q, sizeof q, NO_LIMITS, "never stored");
    /* In a 9-byte pickle the memo has room for indexes 0..9: index 10 is just past it. */
    unsigned char r[] = {0x80, 0x02, 'N', 'q', 0, '0', 'h', 10, '.'};
    expect("BINGET of the index just past the memo's room", r, sizeof r, NO_LIMITS,
           "memo index 10 was never stored");
}

/* TUPLE3 needs three values above the innermost MARK. */
static void test_stack(void) {
    EXPECT("TUPLE3 of three values", "\x80\x02K\x01K\x02K\x03\x87.", NULL);
    EXPECT("TUPLE3 of two values", "\x80\x02K\x01K\x02\x87.", "stack underflow (needs 3");
    EXPECT("TUPLE3 of two values above a MARK", "\x80\x02K\x01(K\x02K\x03\x87.",
           "stack underflow (needs 3");
}

/* The caller's limits: exactly what the pickle needs passes, one less does not. */
static void test_limits(void) {
    /* MARK, 100 x BININT1, LIST, STOP: 100 values on the stack at once, one mark. */
    unsigned char p[2 + 1 + 200 + 2];
    size_t n = 0;
    p[n++] = 0x80, p[n++] = 0x02, p[n++] = '(';
    for (int i = 0; i < 100; i++) p[n++] = 'K', p[n++] = (unsigned char)i;
    p[n++] = 'l', p[n++] = '.';
    pk_doc doc;
    ckpt_err err = {{0}};
    int rc = parse_with(&doc, p, n, NO_LIMITS, &err);
    size_t values = rc ? 0 : doc.values;
    ok(rc == 0 && values >= 101, "100 ints in a list: %zu values", values);
    if (!rc) pk_free(&doc);
    expect("max_values at exactly the count", p, n, (pk_limits){0, 0, values}, NULL);
    expect("max_values one below the count", p, n, (pk_limits){0, 0, values - 1}, "values (limit)");
    expect("max_stack 100 for 100 stacked values", p, n, (pk_limits){100, 0, 0}, NULL);
    expect("max_stack 99 for 100 stacked values", p, n, (pk_limits){99, 0, 0}, "stack would hold");
    /* One value, made last: a limit of exactly one passes. */
    expect("max_values 1 for a single NONE", "\x80\x02N.", 4, (pk_limits){0, 0, 1}, NULL);
    expect("max_values 1 for NONE, NONE", "\x80\x02NN0.", 6, (pk_limits){0, 0, 1},
           "values (limit)");
    /* Three nested MARKs. */
    static const char marks[] = "\x80\x02(((ttt.";
    expect("max_marks 3 for 3 nested MARKs", marks, sizeof marks - 1, (pk_limits){0, 3, 0}, NULL);
    expect("max_marks 2 for 3 nested MARKs", marks, sizeof marks - 1, (pk_limits){0, 2, 0},
           "nested MARKs");
}

int main(void) {
    test_operands();
    test_long_widths();
    test_memo();
    test_stack();
    test_limits();
    return tap_done();
}
