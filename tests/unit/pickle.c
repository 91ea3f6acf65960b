/* The restricted unpickler on hand-assembled opcode streams (opcode bytes from CPython's
 * pickletools table), its JSON rendering, and the zip reader on slices of a file (how DCP
 * .distcp files hold one torch archive per item). */
#include "model/catalog.h"
#include "parse/pickle.h"
#include "tap.h"
#include "parse/zip.h"

#include <math.h>
#include <stdlib.h>
#include <unistd.h>

static const pk_options default_opts = {"unit.pkl", 1000, &pk_torch_globals, 1, {0, 0, 0}, NULL};

static int parse(pk_doc *doc, const char *data, size_t len, ckpt_err *err) {
    return pk_parse(doc, data, len, &default_opts, err);
}

#define PARSE(doc, lit, err) parse(doc, lit, sizeof lit - 1, err)

static const pk_value *item(const pk_value *v, uint32_t i) {
    return v->u.c.items[i];
}

static void test_scalars(void) {
    /* {"a": 1, "b": -2, "c": 300, "d": 1.5, "e": True, "f": None, "g": 2**70, "h": -129} */
    static const char p[] = "\x80\x02}q\x00("
                            "X\x01\x00\x00\x00"
                            "aK\x01"
                            "X\x01\x00\x00\x00"
                            "bJ\xfe\xff\xff\xff"
                            "X\x01\x00\x00\x00"
                            "cM\x2c\x01"
                            "X\x01\x00\x00\x00"
                            "dG\x3f\xf8\x00\x00\x00\x00\x00\x00"
                            "X\x01\x00\x00\x00"
                            "e\x88"
                            "X\x01\x00\x00\x00"
                            "fN"
                            "X\x01\x00\x00\x00g\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x40"
                            "X\x01\x00\x00\x00h\x8a\x02\x7f\xff"
                            "u.";
    pk_doc doc;
    ckpt_err err = {{0}};
    int rc = PARSE(&doc, p, &err);
    ok(rc == 0, "scalars parse (%s)", err.msg);
    if (rc) return;
    const pk_value *r = doc.root;
    ok(r->kind == PK_DICT && r->n == 8, "a dict of 8 pairs");
    const pk_value *a = pk_dict_get(r, "a"), *b = pk_dict_get(r, "b"), *c = pk_dict_get(r, "c"),
                   *d = pk_dict_get(r, "d"), *e = pk_dict_get(r, "e"), *f = pk_dict_get(r, "f"),
                   *g = pk_dict_get(r, "g"), *h = pk_dict_get(r, "h");
    ok(a && a->kind == PK_INT && a->u.i == 1, "BININT1 1");
    ok(b && b->kind == PK_INT && b->u.i == -2, "BININT -2 (signed)");
    ok(c && c->kind == PK_INT && c->u.i == 300, "BININT2 300");
    ok(d && d->kind == PK_FLOAT && d->u.f == 1.5, "BINFLOAT is big-endian: 1.5");
    ok(e && e->kind == PK_BOOL && e->u.b, "NEWTRUE");
    ok(f && f->kind == PK_NONE, "NONE");
    ok(g && g->kind == PK_BIGINT && g->u.s.len == 9, "LONG1 of 9 bytes stays exact (2^70)");
    ok(h && h->kind == PK_INT && h->u.i == -129, "LONG1 0x7f 0xff = -129");
    ok(doc.end == sizeof p - 1, "end is just after STOP");
    ok(d->pos == 1000 + 40, "values carry their file offset (base + opcode position)");

    strbuf sb;
    sb_init(&sb);
    size_t budget = 100;
    ok(pk_to_json(&sb, r, &budget), "renders as JSON");
    sb_putc(&sb, '\0');
    const char *want = "{\"a\": 1, \"b\": -2, \"c\": 300, \"d\": 1.5, \"e\": true, \"f\": null, "
                       "\"g\": \"1180591620717411303424\", \"h\": -129}";
    ok(sb.data && strcmp(sb.data, want) == 0, "JSON is %s", sb.data);
    sb_free(&sb);
    pk_free(&doc);
}

static void test_containers_and_memo(void) {
    /* x = [1]; (x, x, (), (1, 2, 3), [2, 3], {1: "v"}) with protocol 4 framing and MEMOIZE */
    static const char p[] = "\x80\x04\x95\x20\x00\x00\x00\x00\x00\x00\x00"
                            "(]\x94K\x01"
                            "a"
                            "h\x00)K\x01K\x02K\x03\x87"
                            "](K\x02K\x03"
                            "e"
                            "}K\x01\x8c\x01vs"
                            "t.";
    pk_doc doc;
    ckpt_err err = {{0}};
    int rc = PARSE(&doc, p, &err);
    ok(rc == 0, "containers parse (%s)", err.msg);
    if (rc) return;
    const pk_value *t = doc.root;
    ok(t->kind == PK_TUPLE && t->n == 6, "TUPLE of 6");
    ok(item(t, 0) == item(t, 1), "BINGET returns the memoized object itself (shared)");
    ok(item(t, 0)->kind == PK_LIST && item(t, 0)->n == 1, "APPEND filled the shared list");
    ok(item(t, 2)->kind == PK_TUPLE && item(t, 2)->n == 0, "EMPTY_TUPLE");
    ok(item(t, 3)->n == 3 && item(item(t, 3), 2)->u.i == 3, "TUPLE3");
    ok(item(t, 4)->kind == PK_LIST && item(t, 4)->n == 2, "APPENDS");
    const pk_value *d = item(t, 5);
    ok(d->kind == PK_DICT && d->n == 1 && item(d, 0)->u.i == 1 && pk_is_str(item(d, 1), "v"),
       "SETITEM with an int key and a SHORT_BINUNICODE value");
    strbuf sb;
    sb_init(&sb);
    size_t budget = 100;
    pk_to_json(&sb, t, &budget);
    sb_putc(&sb, '\0');
    ok(sb.data && strcmp(sb.data, "[[1], [1], [], [1, 2, 3], [2, 3], {\"1\": \"v\"}]") == 0,
       "JSON %s", sb.data);
    sb_free(&sb);
    pk_free(&doc);
}

static void test_torch_objects(void) {
    /* OrderedDict() with items and a BUILD state, then a tensor rebuild call with a persistent
     * id, as torch.save writes them. */
    static const char p[] = "\x80\x02"
                            "ccollections\nOrderedDict\nq\x00)Rq\x01("
                            "X\x01\x00\x00\x00w"
                            "ctorch._utils\n_rebuild_tensor_v2\nq\x02"
                            "((X\x07\x00\x00\x00storagectorch\nFloatStorage\n"
                            "X\x01\x00\x00\x00"
                            "0X\x03\x00\x00\x00"
                            "cpuK\x06tQ"
                            "K\x00K\x02K\x03\x86K\x03K\x01\x86\x89h\x00)Rtq\x03R"
                            "u}X\x09\x00\x00\x00_metadatah\x00)Rsb.";
    pk_doc doc;
    ckpt_err err = {{0}};
    int rc = PARSE(&doc, p, &err);
    ok(rc == 0, "torch state dict parses (%s)", err.msg);
    if (rc) return;
    const pk_value *sd = doc.root;
    ok(sd->kind == PK_DICT && sd->u.c.cls && sd->u.c.cls->tag == PK_G_DICT_CLASS,
       "REDUCE(OrderedDict, ()) is a dict that remembers its class");
    ok(sd->u.c.state && sd->u.c.state->kind == PK_DICT, "BUILD stored the _metadata state");
    const pk_value *w = pk_dict_get(sd, "w");
    ok(w && w->kind == PK_CALL && pk_call_global(w)->tag == PK_G_REBUILD_V2,
       "the tensor is a description of a _rebuild_tensor_v2 call");
    const pk_value *args = w->u.call.args;
    ok(args->n == 6 && item(args, 0)->kind == PK_PERSID, "6 arguments, the first a persistent id");
    const pk_value *id = item(args, 0)->u.persid;
    ok(id->kind == PK_TUPLE && id->n == 5 && item(id, 1)->kind == PK_GLOBAL &&
           item(id, 1)->u.global->tag == PK_G_STORAGE && item(id, 1)->u.global->dtype == CKPT_F32 &&
           item(id, 1)->u.global->esz == 4,
       "storage class FloatStorage resolves to F32, 4 bytes");
    pk_free(&doc);
}

static void expect_refusal(const char *what, const char *data, size_t len, const pk_options *o,
                           int code, const char *needle) {
    pk_doc doc;
    ckpt_err err = {{0}};
    int rc = pk_parse(&doc, data, len, o ? o : &default_opts, &err);
    ok(rc != 0 && (!code || rc == code) && strstr(err.msg, needle) != NULL,
       "%s is refused, naming \"%s\"", what, needle);
    if (rc == 0)
        pk_free(&doc);
    else if (!strstr(err.msg, needle) || (code && rc != code))
        printf("#   rc %d: %s\n", rc, err.msg);
}

#define REFUSE(what, lit, code, needle)                                                            \
    expect_refusal(what, lit, sizeof lit - 1, NULL, code, needle)

static void test_refusals(void) {
    REFUSE("GLOBAL os.system", "\x80\x02\x63os\nsystem\nq\x00.", -EPERM, "os.system");
    REFUSE("GLOBAL posix.system", "\x80\x02\x63posix\nsystem\n.", -EPERM, "posix.system");
    REFUSE("GLOBAL __builtin__.eval (mapped to builtins)", "\x80\x02\x63__builtin__\neval\n.",
           -EPERM, "builtins.eval");
    REFUSE("STACK_GLOBAL subprocess.Popen", "\x80\x04\x8c\x0asubprocess\x8c\x05Popen\x93.", -EPERM,
           "subprocess.Popen");
    REFUSE("GLOBAL builtins.__import__", "\x80\x02\x63\x62uiltins\n__import__\n.", -EPERM,
           "builtins.__import__");
    REFUSE("a similar but unlisted torch name", "\x80\x02\x63torch._utils\n_rebuild_evil\n.",
           -EPERM, "torch._utils._rebuild_evil");
    REFUSE("INST", "\x80\x02(ios\nsystem\n.", 0, "INST");
    REFUSE("OBJ", "\x80\x02(o.", 0, "OBJ");
    REFUSE("REDUCE of something that is not a global", "\x80\x02K\x01)R.", 0, "not an allowlisted");
    REFUSE("unknown opcode", "\x80\x02\xf0.", 0, "0xf0");
    REFUSE("protocol 6", "\x80\x06N.", 0, "protocol 6");
    REFUSE("BINGET of an unset index", "\x80\x02h\x03.", 0, "memo index 3");
    REFUSE("LONG_BINPUT far beyond the pickle", "\x80\x02Nr\x00\x00\x00\x01.", 0, "memo index");
    REFUSE("stack underflow",
           "\x80\x02"
           "a.",
           0, "underflow");
    REFUSE("TUPLE2 with one value", "\x80\x02N\x86.", 0, "underflow");
    REFUSE("POP that removes the MARK, then one more", "\x80\x02N(00\x30.", 0, "underflow");
    REFUSE("SETITEMS on a list", "\x80\x02](NNu.", 0, "not a dict");
    REFUSE("no STOP", "\x80\x02N", PK_ETRUNC, "STOP");
    REFUSE("truncated BININT", "\x80\x02J\x01\x02", PK_ETRUNC, "truncated");
    REFUSE("BINUNICODE longer than the data",
           "\x80\x02X\x10\x00\x00\x00"
           "abc",
           PK_ETRUNC, "runs past");
    REFUSE("the message gives the file offset", "\x80\x02\xf0.", 0, "at offset 1002");

    pk_options small = default_opts;
    small.limits.max_stack = 10;
    static const char many[] = "\x80\x02NNNNNNNNNNNN.";
    expect_refusal("an 11th value on a 10-value stack", many, sizeof many - 1, &small, -E2BIG,
                   "stack");
    small = default_opts;
    small.limits.max_marks = 3;
    static const char marks[] = "\x80\x02((((N.";
    expect_refusal("a 4th nested MARK", marks, sizeof marks - 1, &small, -E2BIG, "MARK");
    small = default_opts;
    small.limits.max_values = 5;
    static const char values[] = "\x80\x02](NNNNNNe.";
    expect_refusal("the 6th value", values, sizeof values - 1, &small, -E2BIG, "values");
}

static void test_json(void) {
    /* [0.1, inf, nan, -1e300, b"\x01\xff", torch.Size((2, 3)), torch.device("cuda", 1), -2**70] */
    static const char p[] = "\x80\x02](G\x3f\xb9\x99\x99\x99\x99\x99\x9a"
                            "G\x7f\xf0\x00\x00\x00\x00\x00\x00"
                            "G\x7f\xf8\x00\x00\x00\x00\x00\x00"
                            "G\xfe\x37\xe4\x3c\x88\x00\x75\x9c"
                            "C\x02\x01\xff"
                            "ctorch\nSize\nK\x02K\x03\x86\x85R"
                            "ctorch\ndevice\nX\x04\x00\x00\x00\x63udaK\x01\x86R"
                            "\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\xc0"
                            "ctorch\nbfloat16\n"
                            "e.";
    pk_doc doc;
    ckpt_err err = {{0}};
    int rc = PARSE(&doc, p, &err);
    ok(rc == 0, "JSON sample parses (%s)", err.msg);
    if (rc) return;
    strbuf sb;
    sb_init(&sb);
    size_t budget = 100;
    ok(pk_to_json(&sb, doc.root, &budget), "renders");
    sb_putc(&sb, '\0');
    const char *want = "[0.1, \"inf\", \"nan\", -1e+300, {\"bytes\": \"01ff\"}, "
                       "[2, 3], \"cuda:1\", \"-1180591620717411303424\", "
                       "{\"global\": \"torch.bfloat16\"}]";
    ok(sb.data && strcmp(sb.data, want) == 0, "JSON %s", sb.data);
    sb_free(&sb);
    pk_free(&doc);

    /* A list that contains itself: depth-limited, not endless. */
    static const char cyc[] = "\x80\x02]q\x00h\x00\x61.";
    rc = PARSE(&doc, cyc, &err);
    ok(rc == 0 && item(doc.root, 0) == doc.root, "a cyclic list parses (L = [L])");
    if (rc) return;
    sb_init(&sb);
    budget = 1000;
    ok(pk_to_json(&sb, doc.root, &budget) && !sb.failed && strstr(sb.data, "deeper than"),
       "its JSON stops at the depth limit");
    sb_free(&sb);
    sb_init(&sb);
    budget = 10;
    ok(!pk_to_json(&sb, doc.root, &budget), "a small visit budget runs out and says so");
    sb_free(&sb);
    pk_free(&doc);
}

/* A caller's own allowlist table (how a DCP reader adds its metadata classes): NEWOBJ + BUILD of
 * a dataclass, protocol 4 spelling. */
static void test_user_table(void) {
    static const pk_global dcp[] = {
        {"torch.distributed.checkpoint.metadata", "Metadata", PK_G_USER, -1, 0, NULL},
    };
    const pk_table tables[2] = {pk_torch_globals, {dcp, 1}};
    pk_options o = default_opts;
    o.tables = tables;
    o.ntables = 2;
    static const char p[] = "\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00"
                            "\x8c\x25torch.distributed.checkpoint.metadata\x94"
                            "\x8c\x08Metadata\x94\x93\x94)\x81\x94}\x94"
                            "\x8c\x07version\x94\x8c\x05"
                            "1.0.0\x94sb.";
    pk_doc doc;
    ckpt_err err = {{0}};
    int rc = pk_parse(&doc, p, sizeof p - 1, &o, &err);
    ok(rc == 0, "NEWOBJ + BUILD with a caller's table parses (%s)", err.msg);
    if (!rc) {
        const pk_value *m = doc.root;
        ok(m->kind == PK_CALL && m->newobj && pk_call_global(m)->tag == PK_G_USER,
           "NEWOBJ gives a call node tagged by the caller's table");
        ok(m->u.call.state && pk_is_str(pk_dict_get(m->u.call.state, "version"), "1.0.0"),
           "BUILD attached the instance dict");
        pk_free(&doc);
    }
    expect_refusal("the same class without the caller's table", p, sizeof p - 1, NULL, -EPERM,
                   "torch.distributed.checkpoint.metadata.Metadata");
}

/* ---- zip on slices ---- */

static void put16(unsigned char *p, unsigned v) {
    p[0] = (unsigned char)v, p[1] = (unsigned char)(v >> 8);
}

static void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* A zip of two STORED records "archive/a" = "hello", "archive/b" = "worlds!" (b compressed
 * when method != 0). Returns its length. */
static size_t make_zip(unsigned char *z, unsigned method_b) {
    const char *names[2] = {"archive/a", "archive/b"}, *data[2] = {"hello", "worlds!"};
    size_t at = 0, local[2];
    for (int i = 0; i < 2; i++) {
        size_t n = strlen(names[i]), d = strlen(data[i]);
        local[i] = at;
        memset(z + at, 0, 30);
        put32(z + at, 0x04034b50);
        put16(z + at + 8, i ? method_b : 0);
        put32(z + at + 18, (uint32_t)d);
        put32(z + at + 22, (uint32_t)d);
        put16(z + at + 26, (unsigned)n);
        put16(z + at + 28, 3); /* an extra field the central header does not have */
        memcpy(z + at + 30, names[i], n);
        memcpy(z + at + 30 + n, "xyz", 3);
        memcpy(z + at + 33 + n, data[i], d);
        at += 33 + n + d;
    }
    size_t cd = at;
    for (int i = 0; i < 2; i++) {
        size_t n = strlen(names[i]), d = strlen(data[i]);
        memset(z + at, 0, 46);
        put32(z + at, 0x02014b50);
        put16(z + at + 10, i ? method_b : 0);
        put32(z + at + 20, (uint32_t)d);
        put32(z + at + 24, (uint32_t)d);
        put16(z + at + 28, (unsigned)n);
        put32(z + at + 42, (uint32_t)local[i]);
        memcpy(z + at + 46, names[i], n);
        at += 46 + n;
    }
    memset(z + at, 0, 22);
    put32(z + at, 0x06054b50);
    put16(z + at + 8, 2);
    put16(z + at + 10, 2);
    put32(z + at + 12, (uint32_t)(at - cd));
    put32(z + at + 16, (uint32_t)cd);
    return at + 22;
}

static void test_zip_slices(void) {
    unsigned char z1[512], z2[512];
    size_t n1 = make_zip(z1, 0), n2 = make_zip(z2, 8);
    char path[] = "/tmp/ckpt-unit-zip-XXXXXX";
    int fd = mkstemp(path);
    /* junk, zip 1, zip 2, junk: like items of a .distcp file */
    int okw = fd >= 0 && write(fd, "JUNK", 4) == 4 && write(fd, z1, n1) == (ssize_t)n1 &&
              write(fd, z2, n2) == (ssize_t)n2 && write(fd, "TAIL", 4) == 4;
    if (fd >= 0) close(fd);
    ok(okw, "wrote two concatenated zips");
    ckpt_catalog *cat = catalog_new(path, "unit");
    uint32_t src;
    ckpt_err err = {{0}};
    ok(cat && catalog_add_source(cat, path, "zips", &src, &err) == 0, "source added");

    zip_archive za;
    int rc = zip_open(&za, cat, src, 4, n1, "zip 1", &err);
    ok(rc == 0 && za.count == 2, "zip 1 opens on its slice (%s)", err.msg);
    const zip_entry *b = rc ? NULL : zip_find(&za, "archive/b", 9);
    uint64_t off = 0;
    ok(b && zip_data_offset(&za, b, &off, &err) == 0 && off == 4 + (33 + 9 + 5) + 33 + 9,
       "record b's bytes: absolute offset from the LOCAL header (extra field included)");
    char *data = NULL;
    size_t len = 0;
    ok(b && zip_read(&za, b, 100, &data, &len, &err) == 0 && len == 7 &&
           memcmp(data, "worlds!", 7) == 0,
       "zip_read gives the stored bytes");
    free(data);
    ok(b && zip_read(&za, b, 3, &data, &len, &err) != 0 && strstr(err.msg, "limit"),
       "zip_read refuses a record above its limit");
    ok(!zip_find(&za, "archive/c", 9), "an absent name is not found");
    zip_close(&za);

    err.msg[0] = 0;
    rc = zip_open(&za, cat, src, 4 + n1, n2, "zip 2", &err);
    ok(rc == 0 && za.count == 2, "zip 2 opens on its slice (%s)", err.msg);
    b = rc ? NULL : zip_find(&za, "archive/b", 9);
    ok(b && zip_data_offset(&za, b, &off, &err) == -ENOTSUP && strstr(err.msg, "archive/b") &&
           strstr(err.msg, "deflate"),
       "a compressed record is refused by name");
    zip_close(&za);

    ok(zip_open(&za, cat, src, 0, 4 + n1 + n2 + 4, NULL, &err) != 0 &&
           strstr(err.msg, "end of central directory"),
       "the whole file is not one zip (trailing bytes after the last end record)");
    ok(zip_open(&za, cat, src, 4, n1 - 1, NULL, &err) != 0,
       "a slice one byte short has no end record");
    ok(zip_open(&za, cat, src, 4, 1u << 20, NULL, &err) != 0 && strstr(err.msg, "past the end"),
       "a slice past the end of the file is refused");
    ckpt_close(cat);
    unlink(path);
}

int main(void) {
    test_scalars();
    test_containers_and_memo();
    test_torch_objects();
    test_refusals();
    test_json();
    test_user_table();
    test_zip_slices();
    return tap_done();
}
