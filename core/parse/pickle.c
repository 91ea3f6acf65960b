/* The restricted unpickler (see pickle.h). Opcode meanings follow CPython's pickletools
 * documentation; only the protocol 2..5 opcodes that plain data needs are accepted. Opcodes
 * that import or instantiate by themselves (INST, OBJ, EXT*), out-of-band buffers and the text
 * forms of protocols 0/1 are refused. */
#include "pickle.h"

#include <errno.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    DEFAULT_MAX_STACK = 100000,
    DEFAULT_MAX_MARKS = 10000,
    DEFAULT_MAX_VALUES = 10000000,
    MAX_GLOBAL_LINE = 256,
    HIGHEST_PROTOCOL = 5,
};

/* ---- allowlist ---- */

#define G(m, n, tag)                                                                               \
    { m, n, tag, -1, 0, NULL }
#define STORAGE(n, dt, esz)                                                                        \
    { "torch", n, PK_G_STORAGE, dt, esz, NULL }
#define QSTORAGE(n, esz)                                                                           \
    { "torch", n, PK_G_STORAGE, -1, esz, "quantized storage" }
#define DTYPE(n, dt, esz)                                                                          \
    { "torch", n, PK_G_DTYPE, dt, esz, NULL }
#define XDTYPE(n, esz, why)                                                                        \
    { "torch", n, PK_G_DTYPE, -1, esz, why }
#define REBUILD_OTHER(n, why)                                                                      \
    { "torch._utils", n, PK_G_REBUILD_OTHER, -1, 0, why }

static const pk_global torch_globals[] = {
    G("collections", "OrderedDict", PK_G_DICT_CLASS),
    G("torch._utils", "_rebuild_tensor", PK_G_REBUILD_TENSOR),
    G("torch._utils", "_rebuild_tensor_v2", PK_G_REBUILD_V2),
    G("torch._utils", "_rebuild_tensor_v3", PK_G_REBUILD_V3),
    G("torch._utils", "_rebuild_parameter", PK_G_REBUILD_PARAMETER),
    G("torch._utils", "_rebuild_parameter_with_state", PK_G_REBUILD_PARAMETER_STATE),
    G("torch._tensor", "_rebuild_from_type_v2", PK_G_REBUILD_FROM_TYPE),
    G("torch._utils", "_rebuild_from_type_v2", PK_G_REBUILD_FROM_TYPE),
    G("torch._utils", "_rebuild_meta_tensor_no_storage", PK_G_REBUILD_META),
    REBUILD_OTHER("_rebuild_qtensor", "quantized tensor"),
    REBUILD_OTHER("_rebuild_sparse_tensor", "sparse tensor"),
    REBUILD_OTHER("_rebuild_sparse_csr_tensor", "sparse CSR tensor"),
    REBUILD_OTHER("_rebuild_nested_tensor", "nested tensor"),
    REBUILD_OTHER("_rebuild_wrapper_subclass", "tensor wrapper subclass"),
    REBUILD_OTHER("_rebuild_device_tensor_from_numpy", "device tensor saved as numpy"),
    REBUILD_OTHER("_rebuild_device_tensor_from_cpu_tensor", "device tensor"),
    REBUILD_OTHER("_rebuild_xla_tensor", "XLA tensor"),
    REBUILD_OTHER("_rebuild_mtia_tensor", "MTIA tensor"),
    G("torch", "Tensor", PK_G_TENSOR_CLASS),
    G("torch._tensor", "Tensor", PK_G_TENSOR_CLASS),
    G("torch.nn.parameter", "Parameter", PK_G_TENSOR_CLASS),
    STORAGE("DoubleStorage", CKPT_F64, 8),
    STORAGE("FloatStorage", CKPT_F32, 4),
    STORAGE("HalfStorage", CKPT_F16, 2),
    STORAGE("BFloat16Storage", CKPT_BF16, 2),
    STORAGE("LongStorage", CKPT_I64, 8),
    STORAGE("IntStorage", CKPT_I32, 4),
    STORAGE("ShortStorage", CKPT_I16, 2),
    STORAGE("CharStorage", CKPT_I8, 1),
    STORAGE("ByteStorage", CKPT_U8, 1),
    STORAGE("BoolStorage", CKPT_BOOL, 1),
    STORAGE("ComplexDoubleStorage", CKPT_C128, 16),
    STORAGE("ComplexFloatStorage", CKPT_C64, 8),
    QSTORAGE("QInt8Storage", 1),
    QSTORAGE("QUInt8Storage", 1),
    QSTORAGE("QInt32Storage", 4),
    QSTORAGE("QUInt4x2Storage", 1),
    QSTORAGE("QUInt2x4Storage", 1),
    /* Untyped storages: the dtype comes from _rebuild_tensor_v3; dtype -1 and no note. */
    {"torch", "UntypedStorage", PK_G_STORAGE, -1, 1, NULL},
    {"torch.storage", "UntypedStorage", PK_G_STORAGE, -1, 1, NULL},
    {"torch", "TypedStorage", PK_G_STORAGE, -1, 1, NULL},
    {"torch.storage", "TypedStorage", PK_G_STORAGE, -1, 1, NULL},
    DTYPE("float32", CKPT_F32, 4),
    DTYPE("float", CKPT_F32, 4),
    DTYPE("float64", CKPT_F64, 8),
    DTYPE("double", CKPT_F64, 8),
    DTYPE("float16", CKPT_F16, 2),
    DTYPE("half", CKPT_F16, 2),
    DTYPE("bfloat16", CKPT_BF16, 2),
    DTYPE("int8", CKPT_I8, 1),
    DTYPE("int16", CKPT_I16, 2),
    DTYPE("short", CKPT_I16, 2),
    DTYPE("int32", CKPT_I32, 4),
    DTYPE("int", CKPT_I32, 4),
    DTYPE("int64", CKPT_I64, 8),
    DTYPE("long", CKPT_I64, 8),
    DTYPE("uint8", CKPT_U8, 1),
    DTYPE("uint16", CKPT_U16, 2),
    DTYPE("uint32", CKPT_U32, 4),
    DTYPE("uint64", CKPT_U64, 8),
    DTYPE("bool", CKPT_BOOL, 1),
    DTYPE("complex64", CKPT_C64, 8),
    DTYPE("cfloat", CKPT_C64, 8),
    DTYPE("complex128", CKPT_C128, 16),
    DTYPE("cdouble", CKPT_C128, 16),
    DTYPE("float8_e4m3fn", CKPT_F8_E4M3, 1),
    DTYPE("float8_e5m2", CKPT_F8_E5M2, 1),
    DTYPE("float8_e4m3fnuz", CKPT_F8_E4M3FNUZ, 1),
    DTYPE("float8_e5m2fnuz", CKPT_F8_E5M2FNUZ, 1),
    DTYPE("float8_e8m0fnu", CKPT_F8_E8M0, 1),
    XDTYPE("complex32", 4, "complex32 has no ckptfs dtype"),
    XDTYPE("chalf", 4, "complex32 has no ckptfs dtype"),
    XDTYPE("float4_e2m1fn_x2", 1, "packed fp4 pairs are not supported"),
    XDTYPE("qint8", 1, "quantized"),
    XDTYPE("quint8", 1, "quantized"),
    XDTYPE("qint32", 4, "quantized"),
    XDTYPE("quint4x2", 1, "quantized"),
    XDTYPE("quint2x4", 1, "quantized"),
    XDTYPE("bits1x8", 1, "bit-packed"),
    XDTYPE("bits2x4", 1, "bit-packed"),
    XDTYPE("bits4x2", 1, "bit-packed"),
    XDTYPE("bits8", 1, "opaque bits"),
    XDTYPE("bits16", 2, "opaque bits"),
    G("torch", "Size", PK_G_SIZE),
    G("torch", "device", PK_G_DEVICE),
    G("torch.serialization", "_get_layout", PK_G_OPAQUE),
    G("torch", "strided", PK_G_OPAQUE),
    G("torch", "sparse_coo", PK_G_OPAQUE),
    G("torch", "contiguous_format", PK_G_OPAQUE),
    G("torch", "channels_last", PK_G_OPAQUE),
    G("torch", "channels_last_3d", PK_G_OPAQUE),
    G("torch", "preserve_format", PK_G_OPAQUE),
    G("torch.torch_version", "TorchVersion", PK_G_STR_CLASS),
    G("_codecs", "encode", PK_G_CODECS_ENCODE),
    G("builtins", "set", PK_G_SET_CLASS),
    G("builtins", "frozenset", PK_G_SET_CLASS),
    G("builtins", "bytearray", PK_G_OPAQUE),
    G("builtins", "complex", PK_G_OPAQUE),
    G("builtins", "slice", PK_G_OPAQUE),
    G("collections", "Counter", PK_G_OPAQUE),
    /* Data-only classes of training checkpoints (RNG states, metrics, CLI args). */
    G("numpy.core.multiarray", "_reconstruct", PK_G_OPAQUE),
    G("numpy._core.multiarray", "_reconstruct", PK_G_OPAQUE),
    G("numpy.core.multiarray", "scalar", PK_G_OPAQUE),
    G("numpy._core.multiarray", "scalar", PK_G_OPAQUE),
    G("numpy", "ndarray", PK_G_OPAQUE),
    G("numpy", "dtype", PK_G_OPAQUE),
    G("argparse", "Namespace", PK_G_OPAQUE),
};

const pk_table pk_torch_globals = {torch_globals, sizeof torch_globals / sizeof *torch_globals};

/* ---- opcodes ---- */

enum {
    OP_MARK = '(',
    OP_STOP = '.',
    OP_POP = '0',
    OP_POP_MARK = '1',
    OP_DUP = '2',
    OP_BINBYTES = 'B',
    OP_SHORT_BINBYTES = 'C',
    OP_BINFLOAT = 'G',
    OP_BININT = 'J',
    OP_BININT1 = 'K',
    OP_BININT2 = 'M',
    OP_NONE = 'N',
    OP_PERSID = 'P',
    OP_BINPERSID = 'Q',
    OP_REDUCE = 'R',
    OP_BINSTRING = 'T',
    OP_SHORT_BINSTRING = 'U',
    OP_BINUNICODE = 'X',
    OP_APPEND = 'a',
    OP_BUILD = 'b',
    OP_GLOBAL = 'c',
    OP_DICT = 'd',
    OP_EMPTY_DICT = '}',
    OP_APPENDS = 'e',
    OP_BINGET = 'h',
    OP_LONG_BINGET = 'j',
    OP_LIST = 'l',
    OP_EMPTY_LIST = ']',
    OP_BINPUT = 'q',
    OP_LONG_BINPUT = 'r',
    OP_SETITEM = 's',
    OP_TUPLE = 't',
    OP_EMPTY_TUPLE = ')',
    OP_SETITEMS = 'u',
    OP_PROTO = 0x80,
    OP_NEWOBJ = 0x81,
    OP_TUPLE1 = 0x85,
    OP_TUPLE2 = 0x86,
    OP_TUPLE3 = 0x87,
    OP_NEWTRUE = 0x88,
    OP_NEWFALSE = 0x89,
    OP_LONG1 = 0x8a,
    OP_LONG4 = 0x8b,
    OP_SHORT_BINUNICODE = 0x8c,
    OP_BINUNICODE8 = 0x8d,
    OP_BINBYTES8 = 0x8e,
    OP_EMPTY_SET = 0x8f,
    OP_ADDITEMS = 0x90,
    OP_FROZENSET = 0x91,
    OP_NEWOBJ_EX = 0x92,
    OP_STACK_GLOBAL = 0x93,
    OP_MEMOIZE = 0x94,
    OP_FRAME = 0x95,
    OP_BYTEARRAY8 = 0x96,
};

static const char *op_name(unsigned op) {
    switch (op) {
    case '(':
        return "MARK";
    case '.':
        return "STOP";
    case '0':
        return "POP";
    case '1':
        return "POP_MARK";
    case '2':
        return "DUP";
    case 'B':
        return "BINBYTES";
    case 'C':
        return "SHORT_BINBYTES";
    case 'F':
        return "FLOAT";
    case 'G':
        return "BINFLOAT";
    case 'I':
        return "INT";
    case 'J':
        return "BININT";
    case 'K':
        return "BININT1";
    case 'L':
        return "LONG";
    case 'M':
        return "BININT2";
    case 'N':
        return "NONE";
    case 'P':
        return "PERSID";
    case 'Q':
        return "BINPERSID";
    case 'R':
        return "REDUCE";
    case 'S':
        return "STRING";
    case 'T':
        return "BINSTRING";
    case 'U':
        return "SHORT_BINSTRING";
    case 'V':
        return "UNICODE";
    case 'X':
        return "BINUNICODE";
    case 'a':
        return "APPEND";
    case 'b':
        return "BUILD";
    case 'c':
        return "GLOBAL";
    case 'd':
        return "DICT";
    case '}':
        return "EMPTY_DICT";
    case 'e':
        return "APPENDS";
    case 'g':
        return "GET";
    case 'h':
        return "BINGET";
    case 'i':
        return "INST";
    case 'j':
        return "LONG_BINGET";
    case 'l':
        return "LIST";
    case ']':
        return "EMPTY_LIST";
    case 'o':
        return "OBJ";
    case 'p':
        return "PUT";
    case 'q':
        return "BINPUT";
    case 'r':
        return "LONG_BINPUT";
    case 's':
        return "SETITEM";
    case 't':
        return "TUPLE";
    case ')':
        return "EMPTY_TUPLE";
    case 'u':
        return "SETITEMS";
    case 0x80:
        return "PROTO";
    case 0x81:
        return "NEWOBJ";
    case 0x82:
        return "EXT1";
    case 0x83:
        return "EXT2";
    case 0x84:
        return "EXT4";
    case 0x85:
        return "TUPLE1";
    case 0x86:
        return "TUPLE2";
    case 0x87:
        return "TUPLE3";
    case 0x88:
        return "NEWTRUE";
    case 0x89:
        return "NEWFALSE";
    case 0x8a:
        return "LONG1";
    case 0x8b:
        return "LONG4";
    case 0x8c:
        return "SHORT_BINUNICODE";
    case 0x8d:
        return "BINUNICODE8";
    case 0x8e:
        return "BINBYTES8";
    case 0x8f:
        return "EMPTY_SET";
    case 0x90:
        return "ADDITEMS";
    case 0x91:
        return "FROZENSET";
    case 0x92:
        return "NEWOBJ_EX";
    case 0x93:
        return "STACK_GLOBAL";
    case 0x94:
        return "MEMOIZE";
    case 0x95:
        return "FRAME";
    case 0x96:
        return "BYTEARRAY8";
    case 0x97:
        return "NEXT_BUFFER";
    case 0x98:
        return "READONLY_BUFFER";
    default:
        return NULL;
    }
}

/* ---- parser state ---- */

typedef struct parser {
    const unsigned char *d;
    size_t len;
    size_t at;    /* next byte to read */
    size_t op_at; /* offset of the current opcode */
    unsigned op;
    const pk_options *opt;
    pk_limits lim;
    pk_doc *doc;
    pk_value **stack;
    size_t sp, stack_cap;
    size_t *marks;
    size_t nmarks, marks_cap;
    pk_value **memo; /* all_fetched: by memo index; else by rank among fetched indexes */
    size_t memo_cap, memo_count, memo_limit;
    /* From the first pass: which memo indexes GET ever fetches (bit i), the number of fetched
     * indexes in the words before each word, and which indexes were stored so far. */
    bool all_fetched; /* the first pass could not tell: keep every entry, as if fetched */
    uint64_t *fetched, *stored;
    uint32_t *rank;
    size_t memo_words; /* words in fetched, stored and rank */
    ckpt_err *err;
} parser;

#define OP_POS(p) ((unsigned long long)((p)->opt->base + (p)->op_at))

static int fail(parser *p, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(parser *p, int code, const char *fmt, ...) {
    char what[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    const char *name = op_name(p->op);
    char opbuf[16];
    if (!name) {
        snprintf(opbuf, sizeof opbuf, "0x%02x", p->op);
        name = opbuf;
    }
    return ckpt_fail(p->err, code, "%s: pickle opcode %s at offset %llu: %s", p->opt->label, name,
                     OP_POS(p), what);
}

static int need(parser *p, size_t n) {
    if (p->len - p->at < n)
        return fail(p, PK_ETRUNC,
                    "needs %zu more bytes but the pickle ends at offset %llu "
                    "(truncated)",
                    n, (unsigned long long)(p->opt->base + p->len));
    return 0;
}

static uint64_t rd_le(const unsigned char *b, size_t n) {
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = v << 8 | b[i];
    return v;
}

/* ---- recycling: nodes and small item arrays only the released value held ---- */

static pk_value *take_node(pk_doc *doc) {
    pk_value *v = doc->spare_values;
    if (!v) return arena_alloc(&doc->mem, sizeof *v);
    doc->spare_values = v->u.persid;
    memset(v, 0, sizeof *v);
    return v;
}

static pk_value **grow_big(pk_doc *doc, pk_value **old, size_t cap);

static pk_value **take_items(pk_doc *doc, size_t cap) {
    if (cap >= PK_SPARE_CLASSES) return grow_big(doc, NULL, cap);
    if (doc->spare_items[cap]) {
        void **a = doc->spare_items[cap];
        doc->spare_items[cap] = *a;
        return (pk_value **)a;
    }
    return arena_array(&doc->mem, cap, sizeof(pk_value *));
}

/* Arrays of PK_SPARE_CLASSES slots or more (a state dict's pairs) are malloc'd behind a header
 * naming their entry in doc->big: a dict that doubles to 2^k pairs then leaves no copies of its
 * smaller arrays behind. */
typedef struct big_items {
    size_t slot;
    pk_value *items[];
} big_items;

static pk_value **grow_big(pk_doc *doc, pk_value **old, size_t cap) {
    big_items *h = old ? (big_items *)((char *)old - offsetof(big_items, items)) : NULL;
    if (cap > (SIZE_MAX - sizeof *h) / sizeof(pk_value *)) return NULL;
    if (!h && doc->nbig == doc->cap_big) {
        size_t n = doc->cap_big ? 2 * doc->cap_big : 16;
        void **b = realloc(doc->big, n * sizeof *b);
        if (!b) return NULL;
        doc->big = b;
        doc->cap_big = n;
    }
    big_items *nh = realloc(h, sizeof *nh + cap * sizeof(pk_value *));
    if (!nh) return NULL;
    if (!h) nh->slot = doc->nbig++;
    doc->big[nh->slot] = nh;
    return nh->items;
}

static void give_items(pk_doc *doc, pk_value **items, size_t cap) {
    if (!items || !cap) return;
    if (cap >= PK_SPARE_CLASSES) {
        big_items *h = (big_items *)((char *)items - offsetof(big_items, items));
        doc->big[h->slot] = NULL;
        free(h);
        return;
    }
    *(void **)items = doc->spare_items[cap];
    doc->spare_items[cap] = items;
}

/* Deeper values are left in the arena (freed with the document) rather than recursed into. */
enum { RELEASE_DEPTH = 64 };

/* Recycles v and what only v holds. A value with one owner is reached once: cycles and sharing
 * need a memo fetch or DUP, which mark the value shared, and shared values are kept. */
static void release(pk_doc *doc, pk_value *v, int depth) {
    if (!v || pk_shared(v) || (v->flags & PK_CONST) || depth > RELEASE_DEPTH) return;
    switch ((pk_kind)v->kind) {
    case PK_TUPLE:
    case PK_LIST:
    case PK_SET:
    case PK_DICT: {
        size_t used = v->kind == PK_DICT ? 2 * (size_t)v->n : v->n;
        for (size_t i = 0; i < used; i++) release(doc, v->u.c.items[i], depth + 1);
        if (v->kind == PK_DICT) release(doc, v->u.c.state, depth + 1);
        give_items(doc, v->u.c.items, v->u.c.cap);
        break;
    }
    case PK_CALL:
        release(doc, v->u.call.fn, depth + 1);
        release(doc, v->u.call.args, depth + 1);
        release(doc, v->u.call.kwargs, depth + 1);
        release(doc, v->u.call.state, depth + 1);
        break;
    case PK_PERSID:
        release(doc, v->u.persid, depth + 1);
        break;
    default:
        break;
    }
    v->kind = PK_MARK; /* a recycled node: a stale pointer to it shows as what it is */
    v->u.persid = doc->spare_values;
    doc->spare_values = v;
}

pk_value *pk_new_record(pk_doc *doc, uint32_t tag, const void *data, uint64_t pos) {
    pk_value *v = take_node(doc);
    if (!v) return NULL;
    v->kind = PK_RECORD;
    v->n = tag;
    v->pos = pos;
    v->u.record = data;
    return v;
}

static pk_value *new_value(parser *p, pk_kind kind, int *rc) {
    if (p->doc->values >= p->lim.max_values) {
        *rc = fail(p, -E2BIG, "the pickle holds more than %zu values (limit)", p->lim.max_values);
        return NULL;
    }
    pk_value *v = take_node(p->doc);
    if (!v) {
        *rc = ckpt_fail(p->err, -ENOMEM, "out of memory");
        return NULL;
    }
    p->doc->values++;
    v->kind = (uint8_t)kind;
    v->pos = p->opt->base + p->op_at;
    return v;
}

static int push(parser *p, pk_value *v) {
    if (p->sp == p->stack_cap) {
        if (p->sp >= p->lim.max_stack)
            return fail(p, -E2BIG, "the stack would hold more than %zu values (limit)",
                        p->lim.max_stack);
        size_t cap = p->stack_cap ? p->stack_cap * 2 : 64;
        if (cap > p->lim.max_stack) cap = p->lim.max_stack;
        pk_value **s = realloc(p->stack, cap * sizeof *s);
        if (!s) return ckpt_fail(p->err, -ENOMEM, "out of memory");
        p->stack = s;
        p->stack_cap = cap;
    }
    p->stack[p->sp++] = v;
    return 0;
}

static size_t floor_of_stack(const parser *p) {
    return p->nmarks ? p->marks[p->nmarks - 1] : 0;
}

static int pop(parser *p, pk_value **out) {
    if (p->sp <= floor_of_stack(p))
        return fail(p, -EINVAL, "stack underflow (%s)",
                    p->nmarks ? "a MARK is in the way" : "empty stack");
    *out = p->stack[--p->sp];
    return 0;
}

static int top(parser *p, pk_value **out) {
    if (p->sp <= floor_of_stack(p))
        return fail(p, -EINVAL, "stack underflow (%s)",
                    p->nmarks ? "a MARK is in the way" : "empty stack");
    *out = p->stack[p->sp - 1];
    return 0;
}

/* Pops everything above the last MARK; the items stay valid until the next push. */
static int pop_mark(parser *p, pk_value ***items, size_t *count) {
    if (!p->nmarks) return fail(p, -EINVAL, "no MARK on the stack");
    size_t base = p->marks[--p->nmarks];
    *items = p->sp > base ? p->stack + base : NULL; /* the stack may never have been allocated */
    *count = p->sp - base;
    p->sp = base;
    return 0;
}

/* Makes room for `more` items in a container (items, or key+value slots of a dict). */
static int reserve(parser *p, pk_value *c, size_t more) {
    size_t used = c->kind == PK_DICT ? 2 * (size_t)c->n : c->n;
    if (more > p->lim.max_values - p->doc->values)
        return fail(p, -E2BIG, "the pickle holds more than %zu values (limit)", p->lim.max_values);
    p->doc->values += more;
    if (c->u.c.cap - used >= more) return 0;
    /* Tuples never grow: exactly their size. Lists, sets and dicts double. */
    size_t cap = c->u.c.cap ? c->u.c.cap : c->kind == PK_TUPLE || more > 4 ? more : 4;
    while (cap - used < more) cap *= 2;
    if (cap > UINT32_MAX) return fail(p, -E2BIG, "a container holds more than 2^32 items");
    pk_value **items;
    if (c->u.c.cap >= PK_SPARE_CLASSES) { /* grown in place */
        if (!(items = grow_big(p->doc, c->u.c.items, cap)))
            return ckpt_fail(p->err, -ENOMEM, "out of memory");
    } else {
        if (!(items = take_items(p->doc, cap))) return ckpt_fail(p->err, -ENOMEM, "out of memory");
        if (used) memcpy(items, c->u.c.items, used * sizeof *items);
        give_items(p->doc, c->u.c.items, c->u.c.cap);
    }
    c->u.c.items = items;
    c->u.c.cap = (uint32_t)cap;
    return 0;
}

static int make_seq(parser *p, pk_kind kind, pk_value **items, size_t n, pk_value **out) {
    int rc = 0;
    pk_value *v = new_value(p, kind, &rc);
    if (!v) return rc;
    if (n) {
        if ((rc = reserve(p, v, n))) return rc;
        memcpy(v->u.c.items, items, n * sizeof *items);
        v->n = (uint32_t)n;
    }
    *out = v;
    return 0;
}

static int push_seq(parser *p, pk_kind kind, pk_value **items, size_t n) {
    pk_value *v = NULL;
    int rc = make_seq(p, kind, items, n, &v);
    return rc ? rc : push(p, v);
}

/* Offers the caller's hook the pairs from index `first` on; `nbelow` values of the stack lie
 * under the dict. */
static int offer_pairs(parser *p, pk_value *dict, uint32_t first, size_t nbelow) {
    const pk_hooks *h = p->opt->hooks;
    if (!h || !h->on_pair) return 0;
    pk_pair_site site = {dict, p->stack, nbelow};
    for (uint32_t i = first; i < dict->n; i++) {
        pk_value **slot = dict->u.c.items + 2 * (size_t)i;
        pk_value *k = slot[0], *v = slot[1];
        if (pk_shared(v)) continue;
        int rc = h->on_pair(h->ctx, p->doc, &site, &slot[0], &slot[1], p->err);
        if (rc) return rc;
        if (slot[0] != k) release(p->doc, k, 0);
        if (slot[1] != v) release(p->doc, v, 0);
    }
    return 0;
}

static int add_pairs(parser *p, pk_value *dict, pk_value **kv, size_t n, size_t nbelow) {
    if (n % 2) return fail(p, -EINVAL, "odd number of items (%zu) for key/value pairs", n);
    if (dict->kind != PK_DICT)
        return fail(p, -EINVAL, "sets items on a %s, not a dict", pk_kind_name(dict->kind));
    int rc = reserve(p, dict, n);
    if (rc) return rc;
    uint32_t first = dict->n;
    if (n) memcpy(dict->u.c.items + 2 * (size_t)dict->n, kv, n * sizeof *kv);
    dict->n += (uint32_t)(n / 2);
    return offer_pairs(p, dict, first, nbelow);
}

static int add_items(parser *p, pk_value *c, pk_kind want, pk_value **items, size_t n) {
    if (c->kind != want)
        return fail(p, -EINVAL, "adds items to a %s, not a %s", pk_kind_name(c->kind),
                    pk_kind_name(want));
    int rc = reserve(p, c, n);
    if (rc) return rc;
    if (n) memcpy(c->u.c.items + c->n, items, n * sizeof *items);
    c->n += (uint32_t)n;
    return 0;
}

static int push_str(parser *p, pk_kind kind, size_t n) {
    int rc = need(p, n);
    if (rc) return rc;
    pk_value *v = new_value(p, kind, &rc);
    if (!v) return rc;
    v->u.s.p = (const char *)p->d + p->at;
    v->u.s.len = n;
    p->at += n;
    return push(p, v);
}

/* Reads a length field of `width` bytes and then the string it announces. */
static int read_sized(parser *p, pk_kind kind, size_t width, bool is_signed) {
    int rc = need(p, width);
    if (rc) return rc;
    uint64_t n = rd_le(p->d + p->at, width);
    p->at += width;
    if (is_signed && (n & 0x80000000u))
        return fail(p, -EINVAL, "negative length %lld", (long long)(int32_t)(uint32_t)n);
    if (n > p->len - p->at)
        return fail(p, PK_ETRUNC, "length %llu runs past the end of the pickle at offset %llu",
                    (unsigned long long)n, (unsigned long long)(p->opt->base + p->len));
    return push_str(p, kind, (size_t)n);
}

static int push_int(parser *p, int64_t i) {
    int rc = 0;
    pk_value *v = new_value(p, PK_INT, &rc);
    if (!v) return rc;
    v->u.i = i;
    return push(p, v);
}

static int read_long(parser *p, size_t width) {
    int rc = need(p, width);
    if (rc) return rc;
    uint64_t n = rd_le(p->d + p->at, width);
    p->at += width;
    if (width == 4 && (n & 0x80000000u)) return fail(p, -EINVAL, "negative length");
    if (n > p->len - p->at)
        return fail(p, PK_ETRUNC, "length %llu runs past the end of the pickle",
                    (unsigned long long)n);
    const unsigned char *b = p->d + p->at;
    /* Fits int64 when every byte beyond the 8th repeats the sign. */
    bool neg = n && (b[n - 1] & 0x80);
    bool fits = true;
    for (size_t i = 8; i < n; i++)
        if (b[i] != (neg ? 0xff : 0x00)) fits = false;
    if (n > 8 && fits && ((b[7] & 0x80) != 0) != neg) fits = false;
    if (!fits) return push_str(p, PK_BIGINT, (size_t)n);
    uint64_t u = 0;
    for (size_t i = (n < 8 ? n : 8); i-- > 0;) u = u << 8 | b[i];
    if (neg && n < 8) u |= ~0ull << (8 * n);
    p->at += n;
    return push_int(p, (int64_t)u);
}

static const char *canonical_module(const char *m, size_t *len) {
    if (*len == 11 && memcmp(m, "__builtin__", 11) == 0) {
        *len = 8;
        return "builtins";
    }
    return m;
}

/* A wildcard entry (name "*") covers its module and every submodule of it. */
static bool wildcard_covers(const pk_global *g, const char *mod, size_t mlen) {
    size_t gl = strlen(g->module);
    return strcmp(g->name, "*") == 0 && mlen >= gl && memcmp(g->module, mod, gl) == 0 &&
           (mlen == gl || mod[gl] == '.');
}

/* The global as the tree shows it: a wildcard match gets an entry of its own naming the real
 * module and name (the table's tag), so that messages and JSON say what was pickled. */
static int push_global(parser *p, const pk_global *g, const char *mod, size_t mlen,
                       const char *name, size_t nlen) {
    int rc = 0;
    if (strcmp(g->name, "*") == 0) {
        pk_global *copy = arena_alloc(&p->doc->mem, sizeof *copy);
        char *m = arena_memdup(&p->doc->mem, mod, mlen);
        char *n = arena_memdup(&p->doc->mem, name, nlen);
        if (!copy || !m || !n) return fail(p, -ENOMEM, "out of memory");
        m[mlen] = '\0';
        n[nlen] = '\0';
        *copy = *g;
        copy->module = m;
        copy->name = n;
        g = copy;
    }
    pk_value *v = new_value(p, PK_GLOBAL, &rc);
    if (!v) return rc;
    v->u.global = g;
    return push(p, v);
}

static int resolve_global(parser *p, const char *mod, size_t mlen, const char *name, size_t nlen) {
    mod = canonical_module(mod, &mlen);
    for (size_t t = 0; t < p->opt->ntables; t++) {
        const pk_table *tab = &p->opt->tables[t];
        for (size_t i = 0; i < tab->count; i++) {
            const pk_global *g = &tab->entries[i];
            if ((strlen(g->module) == mlen && memcmp(g->module, mod, mlen) == 0 &&
                 strlen(g->name) == nlen && memcmp(g->name, name, nlen) == 0) ||
                wildcard_covers(g, mod, mlen))
                return push_global(p, g, mod, mlen, name, nlen);
        }
    }
    return fail(p, -EPERM,
                "global %.*s.%.*s is not allowed (ckptfs never imports or runs pickled code; "
                "it accepts only tensor rebuild functions, storage classes, dtypes and plain "
                "containers)",
                (int)(mlen > 100 ? 100 : mlen), mod, (int)(nlen > 100 ? 100 : nlen), name);
}

static int read_line(parser *p, const char **s, size_t *n) {
    size_t avail = p->len - p->at;
    if (avail > MAX_GLOBAL_LINE + 1) avail = MAX_GLOBAL_LINE + 1;
    const unsigned char *nl = memchr(p->d + p->at, '\n', avail);
    if (!nl)
        return fail(p, avail <= MAX_GLOBAL_LINE ? PK_ETRUNC : -EINVAL,
                    "no newline within %d bytes (truncated or malformed)", MAX_GLOBAL_LINE);
    *s = (const char *)p->d + p->at;
    *n = (size_t)(nl - (p->d + p->at));
    p->at += *n + 1;
    return 0;
}

static int op_global(parser *p) {
    const char *mod = NULL, *name = NULL;
    size_t mlen = 0, nlen = 0;
    int rc = read_line(p, &mod, &mlen);
    if (!rc) rc = read_line(p, &name, &nlen);
    return rc ? rc : resolve_global(p, mod, mlen, name, nlen);
}

static int op_stack_global(parser *p) {
    pk_value *name = NULL, *mod = NULL;
    int rc = pop(p, &name);
    if (!rc) rc = pop(p, &mod);
    if (rc) return rc;
    if (name->kind != PK_STR || mod->kind != PK_STR)
        return fail(p, -EINVAL, "module and name must be strings (got %s and %s)",
                    pk_kind_name(mod->kind), pk_kind_name(name->kind));
    rc = resolve_global(p, mod->u.s.p, mod->u.s.len, name->u.s.p, name->u.s.len);
    release(p->doc, name, 0); /* the global names its table entry, not these strings */
    release(p->doc, mod, 0);
    return rc;
}

static int op_reduce(parser *p, bool newobj_ex) {
    pk_value *fn = NULL, *args = NULL, *kwargs = NULL;
    int rc = 0;
    if (newobj_ex && (rc = pop(p, &kwargs))) return rc;
    if ((rc = pop(p, &args)) || (rc = pop(p, &fn))) return rc;
    if (fn->kind != PK_GLOBAL)
        return fail(p, -EINVAL, "calls a %s, not an allowlisted global", pk_kind_name(fn->kind));
    if (args->kind != PK_TUPLE)
        return fail(p, -EINVAL, "arguments are a %s, not a tuple", pk_kind_name(args->kind));
    bool newobj = p->op == OP_NEWOBJ || p->op == OP_NEWOBJ_EX;
    pk_value *v;
    if (fn->u.global->tag == PK_G_DICT_CLASS && !kwargs) {
        /* The dict's items follow as SETITEMS; constructor arguments (none in torch files)
         * would be pairs we cannot see, so refuse them rather than show a partial dict. */
        if (args->n)
            return fail(p, -EINVAL, "%s.%s called with %u arguments (expected none)",
                        fn->u.global->module, fn->u.global->name, args->n);
        if (!(v = new_value(p, PK_DICT, &rc))) return rc;
        v->u.c.cls = fn->u.global;
        /* Nothing holds the empty arguments (and an unshared class) any more: a state dict
         * of tensors each with an empty OrderedDict of hooks kept one of each a tensor. */
        release(p->doc, args, 0);
        release(p->doc, fn, 0);
        return push(p, v);
    }
    if (!(v = new_value(p, PK_CALL, &rc))) return rc;
    v->newobj = newobj;
    v->u.call.fn = fn;
    v->u.call.args = args;
    v->u.call.kwargs = kwargs;
    return push(p, v);
}

static int op_build(parser *p) {
    pk_value *state = NULL, *obj = NULL;
    int rc = pop(p, &state);
    if (!rc) rc = top(p, &obj);
    if (rc) return rc;
    if (obj->kind == PK_CALL)
        obj->u.call.state = state;
    else if (obj->kind == PK_DICT)
        obj->u.c.state = state;
    else
        return fail(p, -EINVAL, "sets the state of a %s", pk_kind_name(obj->kind));
    return 0;
}

static bool bit(const uint64_t *bits, size_t i) {
    return bits[i / 64] >> (i % 64) & 1;
}

/* The memo slot of a fetched index: its rank among the fetched indexes. */
static size_t memo_slot(const parser *p, size_t idx) {
    uint64_t below = p->fetched[idx / 64] & ((UINT64_C(1) << (idx % 64)) - 1);
    return p->rank[idx / 64] + (size_t)__builtin_popcountll(below);
}

static int memo_put(parser *p, size_t idx) {
    pk_value *v = NULL;
    int rc = top(p, &v);
    if (rc) return rc;
    if (idx >= p->memo_limit)
        return fail(p, -EINVAL, "memo index %zu is beyond the %zu entries this pickle can hold",
                    idx, p->memo_limit);
    if (!p->all_fetched) {
        /* The first pass saw every index stored before STOP. */
        if (idx / 64 >= p->memo_words) return 0;
        if (!bit(p->stored, idx)) p->memo_count++;
        p->stored[idx / 64] |= UINT64_C(1) << (idx % 64);
        if (bit(p->fetched, idx)) {
            v->flags |= PK_SHARED;
            p->memo[memo_slot(p, idx)] = v;
        }
        return 0;
    }
    if (idx >= p->memo_cap) {
        size_t cap = p->memo_cap ? p->memo_cap : 64;
        while (cap <= idx) cap *= 2;
        if (cap > p->memo_limit) cap = p->memo_limit;
        pk_value **m = realloc(p->memo, cap * sizeof *m);
        if (!m) return ckpt_fail(p->err, -ENOMEM, "out of memory");
        memset(m + p->memo_cap, 0, (cap - p->memo_cap) * sizeof *m);
        p->memo = m;
        p->memo_cap = cap;
    }
    if (!p->memo[idx]) p->memo_count++;
    v->flags |= PK_SHARED;
    p->memo[idx] = v;
    return 0;
}

static int memo_get(parser *p, size_t idx) {
    pk_value *v = NULL;
    if (p->all_fetched)
        v = idx < p->memo_cap ? p->memo[idx] : NULL;
    else if (idx / 64 < p->memo_words && bit(p->stored, idx) && bit(p->fetched, idx))
        v = p->memo[memo_slot(p, idx)];
    if (!v) return fail(p, -EINVAL, "memo index %zu was never stored", idx);
    return push(p, v);
}

static int read_uint(parser *p, size_t width, size_t *out) {
    int rc = need(p, width);
    if (rc) return rc;
    *out = (size_t)rd_le(p->d + p->at, width);
    p->at += width;
    return 0;
}

/* None, a bool or a small integer: the document's one node for it (PK_CONST). Each occurrence
 * still counts as a value against max_values. */
static int push_const(parser *p, size_t slot, pk_kind kind, int64_t i) {
    int rc = 0;
    pk_value *v = p->doc->consts[slot];
    if (v) {
        if (p->doc->values >= p->lim.max_values)
            return fail(p, -E2BIG, "the pickle holds more than %zu values (limit)",
                        p->lim.max_values);
        p->doc->values++;
        return push(p, v);
    }
    if (!(v = new_value(p, kind, &rc))) return rc;
    if (kind == PK_BOOL)
        v->u.b = i != 0;
    else
        v->u.i = i;
    v->flags = PK_CONST;
    p->doc->consts[slot] = v;
    return push(p, v);
}

/* ---- the first pass: which memo entries are ever fetched ---- */

static bool cover(uint64_t **a, uint64_t **b, size_t *words, size_t idx) {
    if (idx / 64 < *words) return true;
    size_t n = *words ? *words : 16;
    while (n <= idx / 64) n *= 2;
    uint64_t *x = realloc(*a, n * sizeof *x);
    if (x) *a = x;
    uint64_t *y = x ? realloc(*b, n * sizeof *y) : NULL;
    if (y) *b = y;
    if (!x || !y) return false;
    memset(x + *words, 0, (n - *words) * sizeof *x);
    memset(y + *words, 0, (n - *words) * sizeof *y);
    *words = n;
    return true;
}

/* Reads the opcodes up to STOP as the parser will, noting only memo stores and fetches. When it
 * cannot reach STOP (the parse will fail on the way) every entry is kept, as before. */
static void plan_memo(parser *p) {
    const unsigned char *d = p->d;
    size_t len = p->len, at = 0, count = 0, words = 0;
    uint64_t *stored = NULL, *fetched = NULL;
    bool reached = false, ok = true;
    while (ok && !reached && at < len) {
        unsigned op = d[at++];
        size_t skip = 0, width = 0, idx = 0;
        bool put = false, get = false, sized = false, is_signed = false;
        int lines = 0;
        switch (op) {
        case OP_STOP:
            reached = true;
            break;
        case OP_PROTO:
        case OP_BININT1:
            skip = 1;
            break;
        case OP_BININT2:
            skip = 2;
            break;
        case OP_BININT:
            skip = 4;
            break;
        case OP_BINFLOAT:
        case OP_FRAME:
            skip = 8;
            break;
        case OP_BINGET:
        case OP_LONG_BINGET:
        case OP_BINPUT:
        case OP_LONG_BINPUT:
            width = op == OP_BINGET || op == OP_BINPUT ? 1 : 4;
            get = op == OP_BINGET || op == OP_LONG_BINGET;
            put = !get;
            break;
        case OP_MEMOIZE:
            put = true;
            idx = count;
            break;
        case OP_SHORT_BINUNICODE:
        case OP_SHORT_BINSTRING:
        case OP_SHORT_BINBYTES:
        case OP_LONG1:
            width = 1;
            sized = true;
            break;
        case OP_BINSTRING:
        case OP_LONG4:
            is_signed = true;
            /* fall through */
        case OP_BINUNICODE:
        case OP_BINBYTES:
            width = 4;
            sized = true;
            break;
        case OP_BINUNICODE8:
        case OP_BINBYTES8:
        case OP_BYTEARRAY8:
            width = 8;
            sized = true;
            break;
        case OP_GLOBAL:
            lines = 2;
            break;
        case OP_PERSID:
            lines = 1;
            break;
        case OP_MARK:
        case OP_POP:
        case OP_POP_MARK:
        case OP_DUP:
        case OP_NONE:
        case OP_NEWTRUE:
        case OP_NEWFALSE:
        case OP_EMPTY_TUPLE:
        case OP_TUPLE:
        case OP_TUPLE1:
        case OP_TUPLE2:
        case OP_TUPLE3:
        case OP_EMPTY_LIST:
        case OP_LIST:
        case OP_APPEND:
        case OP_APPENDS:
        case OP_EMPTY_DICT:
        case OP_DICT:
        case OP_SETITEM:
        case OP_SETITEMS:
        case OP_EMPTY_SET:
        case OP_ADDITEMS:
        case OP_FROZENSET:
        case OP_STACK_GLOBAL:
        case OP_REDUCE:
        case OP_NEWOBJ:
        case OP_NEWOBJ_EX:
        case OP_BUILD:
        case OP_BINPERSID:
            break;
        default:
            ok = false;
        }
        if (!ok || reached) break;
        if (width) {
            if (len - at < width) break;
            uint64_t v = rd_le(d + at, width);
            at += width;
            if (is_signed && (v & 0x80000000u)) break;
            if (sized) {
                if (v > len - at) break;
                skip = (size_t)v;
            } else {
                idx = (size_t)v;
            }
        }
        for (int i = 0; i < lines; i++) {
            size_t avail = len - at;
            if (avail > MAX_GLOBAL_LINE + 1) avail = MAX_GLOBAL_LINE + 1;
            const unsigned char *nl = memchr(d + at, '\n', avail);
            if (!nl) {
                ok = false;
                break;
            }
            at = (size_t)(nl - d) + 1;
        }
        if (!ok || len - at < skip) break;
        at += skip;
        if (put) {
            if (idx >= p->memo_limit || !cover(&stored, &fetched, &words, idx)) break;
            if (!bit(stored, idx)) count++;
            stored[idx / 64] |= UINT64_C(1) << (idx % 64);
        } else if (get && idx < p->memo_limit) {
            if (!cover(&stored, &fetched, &words, idx)) break;
            fetched[idx / 64] |= UINT64_C(1) << (idx % 64);
        }
    }
    size_t nfetched = 0;
    uint32_t *rank = reached ? malloc((words ? words : 1) * sizeof *rank) : NULL;
    for (size_t w = 0; rank && w < words; w++) {
        rank[w] = (uint32_t)nfetched;
        nfetched += (size_t)__builtin_popcountll(fetched[w]);
        stored[w] = 0; /* the parse records its own stores */
    }
    pk_value **memo = rank ? calloc(nfetched ? nfetched : 1, sizeof *memo) : NULL;
    if (!memo) {
        free(stored);
        free(fetched);
        free(rank);
        p->all_fetched = true;
        return;
    }
    p->stored = stored;
    p->fetched = fetched;
    p->rank = rank;
    p->memo_words = words;
    p->memo = memo;
}

/* Executes one opcode; *stop is set by STOP. */
static int step(parser *p, bool *stop) {
    pk_value *a = NULL, *b = NULL, **items = NULL;
    size_t n = 0;
    int rc = 0;
    p->op_at = p->at;
    if (p->at >= p->len) {
        p->op = 0;
        return ckpt_fail(p->err, PK_ETRUNC,
                         "%s: pickle ends at offset %llu without a STOP opcode "
                         "(truncated)",
                         p->opt->label, (unsigned long long)(p->opt->base + p->len));
    }
    p->op = p->d[p->at++];
    switch (p->op) {
    case OP_PROTO:
        if ((rc = need(p, 1))) return rc;
        if (p->d[p->at] > HIGHEST_PROTOCOL)
            return fail(p, -EINVAL, "protocol %u is newer than %d", p->d[p->at], HIGHEST_PROTOCOL);
        p->at++;
        return 0;
    case OP_FRAME:
        if ((rc = read_uint(p, 8, &n))) return rc;
        if (n > p->len - p->at)
            return fail(p, PK_ETRUNC, "frame of %zu bytes runs past the end of the pickle", n);
        return 0;
    case OP_STOP:
        if ((rc = pop(p, &a))) return rc;
        p->doc->root = a;
        *stop = true;
        return 0;
    case OP_MARK:
        if (p->nmarks == p->lim.max_marks)
            return fail(p, -E2BIG, "more than %zu nested MARKs (limit)", p->lim.max_marks);
        if (p->nmarks == p->marks_cap) {
            size_t cap = p->marks_cap ? p->marks_cap * 2 : 32;
            size_t *m = realloc(p->marks, cap * sizeof *m);
            if (!m) return ckpt_fail(p->err, -ENOMEM, "out of memory");
            p->marks = m;
            p->marks_cap = cap;
        }
        p->marks[p->nmarks++] = p->sp;
        return 0;
    case OP_POP:
        if (p->nmarks && p->sp == p->marks[p->nmarks - 1]) {
            p->nmarks--;
            return 0;
        }
        return pop(p, &a);
    case OP_POP_MARK:
        return pop_mark(p, &items, &n);
    case OP_DUP:
        if ((rc = top(p, &a))) return rc;
        a->flags |= PK_SHARED;
        return push(p, a);
    case OP_NONE:
        return push_const(p, PK_CONST_NONE, PK_NONE, 0);
    case OP_NEWTRUE:
        return push_const(p, PK_CONST_TRUE, PK_BOOL, 1);
    case OP_NEWFALSE:
        return push_const(p, PK_CONST_FALSE, PK_BOOL, 0);
    case OP_BININT:
        if ((rc = need(p, 4))) return rc;
        p->at += 4;
        return push_int(p, (int32_t)(uint32_t)rd_le(p->d + p->at - 4, 4));
    case OP_BININT1:
        if ((rc = need(p, 1))) return rc;
        p->at++;
        return push_const(p, PK_CONST_INT0 + p->d[p->at - 1], PK_INT, p->d[p->at - 1]);
    case OP_BININT2:
        if ((rc = need(p, 2))) return rc;
        p->at += 2;
        return push_int(p, (int64_t)rd_le(p->d + p->at - 2, 2));
    case OP_LONG1:
        return read_long(p, 1);
    case OP_LONG4:
        return read_long(p, 4);
    case OP_BINFLOAT: {
        if ((rc = need(p, 8))) return rc;
        uint64_t bits = 0;
        for (int i = 0; i < 8; i++) bits = bits << 8 | p->d[p->at + i]; /* big-endian */
        p->at += 8;
        pk_value *v = new_value(p, PK_FLOAT, &rc);
        if (!v) return rc;
        memcpy(&v->u.f, &bits, sizeof v->u.f);
        return push(p, v);
    }
    case OP_SHORT_BINUNICODE:
        return read_sized(p, PK_STR, 1, false);
    case OP_BINUNICODE:
        return read_sized(p, PK_STR, 4, false);
    case OP_BINUNICODE8:
        return read_sized(p, PK_STR, 8, false);
    case OP_SHORT_BINSTRING:
        return read_sized(p, PK_STR, 1, false);
    case OP_BINSTRING:
        return read_sized(p, PK_STR, 4, true);
    case OP_SHORT_BINBYTES:
        return read_sized(p, PK_BYTES, 1, false);
    case OP_BINBYTES:
        return read_sized(p, PK_BYTES, 4, false);
    case OP_BINBYTES8:
        return read_sized(p, PK_BYTES, 8, false);
    case OP_BYTEARRAY8:
        return read_sized(p, PK_BYTES, 8, false);
    case OP_EMPTY_TUPLE:
        return push_seq(p, PK_TUPLE, NULL, 0);
    case OP_TUPLE:
        if ((rc = pop_mark(p, &items, &n))) return rc;
        return push_seq(p, PK_TUPLE, items, n);
    case OP_TUPLE1:
    case OP_TUPLE2:
    case OP_TUPLE3: {
        n = p->op - OP_TUPLE1 + 1;
        if (p->sp - floor_of_stack(p) < n)
            return fail(p, -EINVAL, "stack underflow (needs %zu values)", n);
        p->sp -= n;
        return push_seq(p, PK_TUPLE, p->stack + p->sp, n);
    }
    case OP_EMPTY_LIST:
        return push_seq(p, PK_LIST, NULL, 0);
    case OP_LIST:
        if ((rc = pop_mark(p, &items, &n))) return rc;
        return push_seq(p, PK_LIST, items, n);
    case OP_APPEND:
        if ((rc = pop(p, &a)) || (rc = top(p, &b))) return rc;
        return add_items(p, b, PK_LIST, &a, 1);
    case OP_APPENDS:
        if ((rc = pop_mark(p, &items, &n)) || (rc = top(p, &b))) return rc;
        return add_items(p, b, PK_LIST, items, n);
    case OP_EMPTY_DICT: {
        pk_value *v = new_value(p, PK_DICT, &rc);
        return v ? push(p, v) : rc;
    }
    case OP_DICT: {
        if ((rc = pop_mark(p, &items, &n))) return rc;
        pk_value *v = new_value(p, PK_DICT, &rc);
        if (!v || (rc = add_pairs(p, v, items, n, p->sp))) return rc;
        return push(p, v);
    }
    case OP_SETITEM: {
        pk_value *kv[2];
        if ((rc = pop(p, &kv[1])) || (rc = pop(p, &kv[0])) || (rc = top(p, &b))) return rc;
        return add_pairs(p, b, kv, 2, p->sp - 1);
    }
    case OP_SETITEMS:
        if ((rc = pop_mark(p, &items, &n)) || (rc = top(p, &b))) return rc;
        return add_pairs(p, b, items, n, p->sp - 1);
    case OP_EMPTY_SET:
        return push_seq(p, PK_SET, NULL, 0);
    case OP_ADDITEMS:
        if ((rc = pop_mark(p, &items, &n)) || (rc = top(p, &b))) return rc;
        return add_items(p, b, PK_SET, items, n);
    case OP_FROZENSET:
        if ((rc = pop_mark(p, &items, &n))) return rc;
        return push_seq(p, PK_SET, items, n);
    case OP_GLOBAL:
        return op_global(p);
    case OP_STACK_GLOBAL:
        return op_stack_global(p);
    case OP_REDUCE:
    case OP_NEWOBJ:
        return op_reduce(p, false);
    case OP_NEWOBJ_EX:
        return op_reduce(p, true);
    case OP_BUILD:
        return op_build(p);
    case OP_BINPERSID:
    case OP_PERSID: {
        if (p->op == OP_PERSID) {
            const char *s;
            if ((rc = read_line(p, &s, &n))) return rc;
            if (!(a = new_value(p, PK_STR, &rc))) return rc;
            a->u.s.p = s;
            a->u.s.len = n;
        } else if ((rc = pop(p, &a))) {
            return rc;
        }
        pk_value *v = new_value(p, PK_PERSID, &rc);
        if (!v) return rc;
        v->u.persid = a;
        return push(p, v);
    }
    case OP_BINPUT:
        return (rc = read_uint(p, 1, &n)) ? rc : memo_put(p, n);
    case OP_LONG_BINPUT:
        return (rc = read_uint(p, 4, &n)) ? rc : memo_put(p, n);
    case OP_MEMOIZE:
        return memo_put(p, p->memo_count);
    case OP_BINGET:
        return (rc = read_uint(p, 1, &n)) ? rc : memo_get(p, n);
    case OP_LONG_BINGET:
        return (rc = read_uint(p, 4, &n)) ? rc : memo_get(p, n);
    default:
        if (op_name(p->op))
            return fail(p, -ENOTSUP, "opcode is not supported by ckptfs's restricted reader");
        return fail(p, -EINVAL, "unknown opcode (corrupt pickle)");
    }
}

int pk_parse(pk_doc *doc, const char *data, size_t len, const pk_options *opt, ckpt_err *err) {
    memset(doc, 0, sizeof *doc);
    arena_init(&doc->mem);
    parser p = {0};
    p.d = (const unsigned char *)data;
    p.len = len;
    p.opt = opt;
    p.doc = doc;
    p.err = err;
    p.lim = opt->limits;
    if (!p.lim.max_stack) p.lim.max_stack = DEFAULT_MAX_STACK;
    if (!p.lim.max_marks) p.lim.max_marks = DEFAULT_MAX_MARKS;
    if (!p.lim.max_values) p.lim.max_values = DEFAULT_MAX_VALUES;
    /* A writer numbers memo entries from 0 as it stores them, and each store takes at least one
     * byte, so no honest index reaches the pickle's length. */
    p.memo_limit = len < p.lim.max_values ? len + 1 : p.lim.max_values;
    plan_memo(&p);
    bool stop = false;
    int rc = 0;
    while (!stop && !rc) rc = step(&p, &stop);
    free(p.stack);
    free(p.marks);
    free(p.memo);
    free(p.stored);
    free(p.fetched);
    free(p.rank);
    if (rc) {
        pk_free(doc);
        return rc;
    }
    doc->end = p.at;
    return 0;
}

void pk_free(pk_doc *doc) {
    for (size_t i = 0; i < doc->nbig; i++) free(doc->big[i]);
    free(doc->big);
    doc->big = NULL;
    doc->nbig = doc->cap_big = 0;
    arena_free(&doc->mem);
    doc->root = NULL;
}

const char *pk_kind_name(pk_kind k) {
    static const char *const names[] = {
        [PK_NONE] = "None",     [PK_BOOL] = "bool",
        [PK_INT] = "int",       [PK_BIGINT] = "int",
        [PK_FLOAT] = "float",   [PK_STR] = "str",
        [PK_BYTES] = "bytes",   [PK_TUPLE] = "tuple",
        [PK_LIST] = "list",     [PK_SET] = "set",
        [PK_DICT] = "dict",     [PK_GLOBAL] = "global",
        [PK_CALL] = "object",   [PK_PERSID] = "persistent id",
        [PK_RECORD] = "object", [PK_MARK] = "mark",
    };
    return k <= PK_MARK ? names[k] : "?";
}

bool pk_is_str(const pk_value *v, const char *s) {
    size_t n = strlen(s);
    return v && v->kind == PK_STR && v->u.s.len == n && memcmp(v->u.s.p, s, n) == 0;
}

const pk_value *pk_dict_get(const pk_value *dict, const char *key) {
    if (!dict || dict->kind != PK_DICT) return NULL;
    const pk_value *found = NULL;
    for (uint32_t i = 0; i < dict->n; i++) /* the last one wins, as in Python */
        if (pk_is_str(dict->u.c.items[2 * i], key)) found = dict->u.c.items[2 * i + 1];
    return found;
}

const pk_global *pk_call_global(const pk_value *v) {
    return v && v->kind == PK_CALL ? v->u.call.fn->u.global : NULL;
}

const char *pk_global_name(const pk_global *g, char *buf, size_t size) {
    snprintf(buf, size, "%s.%s", g->module, g->name);
    return buf;
}

/* ---- JSON ---- */

enum { JSON_MAX_DEPTH = 64, JSON_MAX_HEX = 4096 };

static void put_double(strbuf *sb, double f) {
    if (f != f) {
        sb_puts(sb, "\"nan\"");
        return;
    }
    if (f > 1.7976931348623157e308 || f < -1.7976931348623157e308) {
        sb_puts(sb, f > 0 ? "\"inf\"" : "\"-inf\"");
        return;
    }
    char buf[40];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, f);
        if (strtod(buf, NULL) == f) break;
    }
    sb_puts(sb, buf);
    if (!strpbrk(buf, ".eE")) sb_puts(sb, ".0");
}

/* Decimal digits of a little-endian two's complement integer of any length. */
static void put_bigint(strbuf *sb, const unsigned char *b, size_t n) {
    if (n > 1024) {
        sb_printf(sb, "\"<integer of %zu bytes>\"", n);
        return;
    }
    unsigned char mag[1024];
    bool neg = n && (b[n - 1] & 0x80);
    unsigned carry = 1;
    for (size_t i = 0; i < n; i++) { /* magnitude = neg ? ~b + 1 : b */
        unsigned x = neg ? (unsigned)(~b[i] & 0xff) + carry : b[i];
        mag[i] = (unsigned char)x;
        carry = neg ? x >> 8 : 0;
    }
    char digits[2600];
    size_t nd = 0, len = n;
    while (len && nd < sizeof digits) {
        unsigned rem = 0;
        for (size_t i = len; i-- > 0;) {
            unsigned cur = rem << 8 | mag[i];
            mag[i] = (unsigned char)(cur / 10);
            rem = cur % 10;
        }
        digits[nd++] = (char)('0' + rem);
        while (len && mag[len - 1] == 0) len--;
    }
    sb_putc(sb, '"');
    if (neg) sb_putc(sb, '-');
    if (!nd) sb_putc(sb, '0');
    while (nd) sb_putc(sb, digits[--nd]);
    sb_putc(sb, '"');
}

static void put_hex(strbuf *sb, const char *p, size_t n) {
    static const char hex[] = "0123456789abcdef";
    sb_puts(sb, "{\"bytes\": \"");
    for (size_t i = 0; i < n && i < JSON_MAX_HEX; i++) {
        sb_putc(sb, hex[(unsigned char)p[i] >> 4]);
        sb_putc(sb, hex[(unsigned char)p[i] & 15]);
    }
    sb_putc(sb, '"');
    if (n > JSON_MAX_HEX) sb_printf(sb, ", \"length\": %zu", n);
    sb_putc(sb, '}');
}

/* A rendering: values left to visit (shared and cyclic graphs), bytes the output may reach
 * (a value referenced many times, and keys escaped once per level of nesting, would otherwise
 * grow without bound), and whether something was cut. Once cut, every container closes at
 * once, so the text stays one valid JSON value. */
typedef struct render {
    size_t *budget;
    size_t limit; /* sb->len past which nothing new is started */
    bool cut;
} render;

static bool to_json(strbuf *sb, const pk_value *v, render *r, int depth);

static void put_marker(strbuf *sb, render *r) {
    sb_puts(sb, "\"<truncated: the rendering reached its size limit>\"");
    r->cut = true;
}

static bool over(const strbuf *sb, const render *r) {
    return sb->len >= r->limit;
}

/* At least the length of sb_json_str's text for s: 2 for an escaped quote or backslash, 6 for
 * \u00XX (controls, and non-ASCII bytes, which take 6 when they are not valid UTF-8). */
static size_t escaped_bound(const char *s, size_t n) {
    size_t len = 2;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        len += c < 0x20 || c >= 0x7f ? 6 : c == '"' || c == '\\' ? 2 : 1;
    }
    return len;
}

static bool put_items(strbuf *sb, pk_value *const *items, size_t n, render *r, int depth) {
    sb_putc(sb, '[');
    for (size_t i = 0; i < n && !r->cut; i++) {
        if (i) sb_puts(sb, ", ");
        if (over(sb, r))
            put_marker(sb, r);
        else if (!to_json(sb, items[i], r, depth + 1))
            return false;
    }
    sb_putc(sb, ']');
    return true;
}

/* A key that is not a string is shown as its own JSON text, escaped. The text is rendered
 * within what is left of the parent's limit: escaping doubles quotes and backslashes, once per
 * level of keys nested in keys. */
static bool put_key(strbuf *sb, const pk_value *k, render *r, int depth) {
    if (k->kind == PK_STR) {
        sb_json_str(sb, k->u.s.p, k->u.s.len);
        return true;
    }
    strbuf tmp;
    sb_init(&tmp);
    render sub = {.budget = r->budget, .limit = (r->limit - sb->len) / 2};
    bool ok = to_json(&tmp, k, &sub, depth + 1);
    if (ok && !tmp.failed) sb_json_str(sb, tmp.data, tmp.len);
    if (tmp.failed) sb->failed = true;
    if (sub.cut) r->cut = true;
    sb_free(&tmp);
    return ok;
}

static bool put_call(strbuf *sb, const pk_value *v, render *r, int depth) {
    const pk_global *g = v->u.call.fn->u.global;
    const pk_value *args = v->u.call.args;
    if (g->tag == PK_G_SIZE && args->n == 1 && args->u.c.items[0]->kind == PK_TUPLE &&
        !v->u.call.state)
        return to_json(sb, args->u.c.items[0], r, depth);
    if (g->tag == PK_G_STR_CLASS && args->n == 1 && args->u.c.items[0]->kind == PK_STR)
        return to_json(sb, args->u.c.items[0], r, depth);
    if (g->tag == PK_G_DEVICE && args->n >= 1 && args->n <= 2 &&
        args->u.c.items[0]->kind == PK_STR &&
        (args->n == 1 || args->u.c.items[1]->kind == PK_INT)) {
        const pk_value *type = args->u.c.items[0];
        if (type->u.s.len > 256) {
            put_marker(sb, r);
            return true;
        }
        strbuf tmp;
        sb_init(&tmp);
        sb_put(&tmp, type->u.s.p, type->u.s.len);
        if (args->n == 2) sb_printf(&tmp, ":%lld", (long long)args->u.c.items[1]->u.i);
        sb_json_str(sb, tmp.data ? tmp.data : "", tmp.len);
        if (tmp.failed) sb->failed = true;
        sb_free(&tmp);
        return true;
    }
    sb_printf(sb, "{\"%s\": \"%s.%s\", \"args\": ", v->newobj ? "new" : "call", g->module, g->name);
    if (!put_items(sb, args->u.c.items, args->n, r, depth)) return false;
    if (v->u.call.kwargs && !r->cut) {
        sb_puts(sb, ", \"kwargs\": ");
        if (!to_json(sb, v->u.call.kwargs, r, depth + 1)) return false;
    }
    if (v->u.call.state && !r->cut) {
        sb_puts(sb, ", \"state\": ");
        if (!to_json(sb, v->u.call.state, r, depth + 1)) return false;
    }
    sb_putc(sb, '}');
    return true;
}

static bool to_json(strbuf *sb, const pk_value *v, render *r, int depth) {
    if (r->cut) {
        sb_puts(sb, "null"); /* a dict's value after a cut key */
        return true;
    }
    if (!*r->budget) return false;
    --*r->budget;
    if (over(sb, r)) {
        put_marker(sb, r);
        return true;
    }
    if (depth > JSON_MAX_DEPTH) {
        sb_printf(sb, "\"<nested deeper than %d levels>\"", JSON_MAX_DEPTH);
        return true;
    }
    switch ((pk_kind)v->kind) {
    case PK_NONE:
        sb_puts(sb, "null");
        return true;
    case PK_BOOL:
        sb_puts(sb, v->u.b ? "true" : "false");
        return true;
    case PK_INT:
        sb_printf(sb, "%lld", (long long)v->u.i);
        return true;
    case PK_BIGINT:
        put_bigint(sb, (const unsigned char *)v->u.s.p, v->u.s.len);
        return true;
    case PK_FLOAT:
        put_double(sb, v->u.f);
        return true;
    case PK_STR:
        /* A string that might not fit is left out whole rather than cut inside a UTF-8
         * sequence. */
        if (escaped_bound(v->u.s.p, v->u.s.len) > r->limit - sb->len) {
            sb_printf(sb, "\"<truncated: a string of %zu bytes>\"", v->u.s.len);
            r->cut = true;
            return true;
        }
        sb_json_str(sb, v->u.s.p, v->u.s.len);
        return true;
    case PK_BYTES:
        put_hex(sb, v->u.s.p, v->u.s.len);
        return true;
    case PK_TUPLE:
    case PK_LIST:
    case PK_SET:
        return put_items(sb, v->u.c.items, v->n, r, depth);
    case PK_DICT:
        sb_putc(sb, '{');
        for (uint32_t i = 0; i < v->n && !r->cut; i++) {
            if (i) sb_puts(sb, ", ");
            if (over(sb, r)) {
                sb_puts(sb, "\"<truncated>\": ");
                put_marker(sb, r);
                break;
            }
            if (!put_key(sb, v->u.c.items[2 * i], r, depth)) return false;
            sb_puts(sb, ": ");
            if (!to_json(sb, v->u.c.items[2 * i + 1], r, depth + 1)) return false;
        }
        sb_putc(sb, '}');
        return true;
    case PK_GLOBAL:
        sb_printf(sb, "{\"global\": \"%s.%s\"}", v->u.global->module, v->u.global->name);
        return true;
    case PK_CALL:
        return put_call(sb, v, r, depth);
    case PK_PERSID:
        sb_puts(sb, "{\"persistent_id\": ");
        if (!to_json(sb, v->u.persid, r, depth + 1)) return false;
        sb_putc(sb, '}');
        return true;
    case PK_RECORD:
    case PK_MARK:
        break;
    }
    sb_puts(sb, "null");
    return true;
}

bool pk_to_json_within(strbuf *sb, const pk_value *v, size_t *budget, size_t max_len,
                       bool *truncated) {
    /* Room for the marker and the closing brackets of the deepest nesting past the limit. */
    size_t reserve = max_len / 4 < 4096 ? max_len / 4 : 4096;
    size_t room = max_len - reserve;
    render r = {.budget = budget, .limit = sb->len + room};
    bool ok = to_json(sb, v, &r, 0);
    if (truncated) *truncated = r.cut;
    return ok;
}

bool pk_to_json(strbuf *sb, const pk_value *v, size_t *budget) {
    return pk_to_json_within(sb, v, budget, PK_JSON_MAX, NULL);
}
