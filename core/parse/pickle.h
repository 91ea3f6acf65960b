/* A restricted unpickler: it turns a Python pickle (protocols 2..5, the opcodes torch.save and
 * torch.distributed.checkpoint write) into a small tree of values and NEVER imports or executes
 * anything.
 *
 * - GLOBAL / STACK_GLOBAL resolve only against allowlist tables (pk_global); any other name is
 *   refused with its "module.name" in the message.
 * - REDUCE / NEWOBJ build a PK_CALL node that describes the call (callable + args + BUILD
 *   state); nothing is called. REDUCE of a dict-making class (collections.OrderedDict) gives a
 *   PK_DICT so that the SETITEMS which follow fill it.
 * - BINPERSID / PERSID give a PK_PERSID node holding the id (torch: a storage reference).
 * - The stack, the mark stack, the memo and the number of values are bounded; memo indexes are
 *   checked. Values may be shared (memo) and even cyclic: walkers must bound their depth.
 * - A first pass over the opcodes finds the memo entries that are ever fetched: only those are
 *   kept (and their values marked shared), so every other value has exactly one owner. A
 *   caller's hook (pk_hooks) may then swap a dict's freshly set key or value for a compact
 *   record of its own while the pickle is read; the parser recycles the nodes only the old
 *   value held, so a pickle of many similar objects never stands whole as a tree.
 *
 * Strings and bytes point into the pickle buffer, which must outlive the parsed document.
 * The JSON of a call node says "new" instead of "call" when NEWOBJ made it. */
#ifndef CKPT_PICKLE_H
#define CKPT_PICKLE_H

#include "../util/arena.h"
#include "../ckpt.h"
#include "../util/strbuf.h"

#include <errno.h>

typedef enum pk_kind {
    PK_NONE,
    PK_BOOL,
    PK_INT,    /* fits int64 */
    PK_BIGINT, /* LONG1/LONG4 beyond int64: u.s holds the little-endian two's complement bytes */
    PK_FLOAT,
    PK_STR, /* UTF-8 as written (not validated) */
    PK_BYTES,
    PK_TUPLE,
    PK_LIST,
    PK_SET, /* set or frozenset */
    PK_DICT,
    PK_GLOBAL,
    PK_CALL,
    PK_PERSID,
    PK_RECORD, /* a caller's compact stand-in for a value it has read (pk_hooks) */
    PK_MARK    /* internal: never in a finished tree */
} pk_kind;

/* What an allowlisted global is, for the code that interprets the tree. */
typedef enum pk_tag {
    PK_G_OPAQUE,         /* data-only class or function: described, never interpreted */
    PK_G_DICT_CLASS,     /* REDUCE(cls, ...) makes a dict (collections.OrderedDict) */
    PK_G_REBUILD_TENSOR, /* torch._utils._rebuild_tensor (pre-1.0 layout) */
    PK_G_REBUILD_V2,     /* torch._utils._rebuild_tensor_v2 */
    PK_G_REBUILD_V3,     /* torch._utils._rebuild_tensor_v3 */
    PK_G_REBUILD_PARAMETER,
    PK_G_REBUILD_PARAMETER_STATE,
    PK_G_REBUILD_FROM_TYPE, /* _rebuild_from_type_v2(func, new_type, args, state) */
    PK_G_REBUILD_META,      /* _rebuild_meta_tensor_no_storage: no bytes */
    PK_G_REBUILD_OTHER,     /* quantized, sparse, nested ... tensors: not supported */
    PK_G_TENSOR_CLASS,      /* torch.Tensor, torch.nn.parameter.Parameter */
    PK_G_STORAGE,           /* torch.<X>Storage, UntypedStorage, TypedStorage */
    PK_G_DTYPE,             /* torch.float32 ... */
    PK_G_SIZE,              /* torch.Size */
    PK_G_DEVICE,            /* torch.device */
    PK_G_CODECS_ENCODE,     /* _codecs.encode: how protocol 2 spells bytes */
    PK_G_SET_CLASS,         /* builtins.set / frozenset */
    PK_G_STR_CLASS,         /* str subclasses such as torch.torch_version.TorchVersion */
    PK_G_USER               /* first tag free for callers' own tables */
} pk_tag;

typedef struct pk_global {
    const char *module;
    const char *name; /* "*": any global of module or of a submodule of it (a caller's table
                         for a framework's own classes, carried as inert data) */
    uint16_t tag;
    /* PK_G_STORAGE and PK_G_DTYPE: the element type, -1 when ckptfs has none (quantized ...);
     * esz = element size in bytes (1 for untyped storage). */
    int16_t dtype;
    uint8_t esz;
    const char *note; /* why a known but unusable global is unusable, or NULL */
} pk_global;

typedef struct pk_table {
    const pk_global *entries;
    size_t count;
} pk_table;

/* Globals of torch.save files: rebuild functions, storage classes, dtypes, containers, and a few
 * data-only classes seen in training checkpoints (numpy arrays and scalars, argparse.Namespace).
 * Nothing else — os, posix, builtins.eval, subprocess ... are refused. */
extern const pk_table pk_torch_globals;

typedef struct pk_value pk_value;

struct pk_value {
    uint8_t kind;  /* pk_kind */
    bool newobj;   /* PK_CALL made by NEWOBJ / NEWOBJ_EX rather than REDUCE */
    uint8_t flags; /* PK_SHARED ... */
    uint32_t n;    /* items in a tuple/list/set, pairs in a dict; PK_RECORD: the caller's tag */
    uint64_t pos;  /* file offset of the opcode that made it */
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t len;
        } s; /* PK_STR, PK_BYTES, PK_BIGINT */
        struct {
            /* PK_TUPLE, PK_LIST, PK_SET: n items; PK_DICT: key, value, key, value ... */
            pk_value **items;
            const pk_global *cls; /* PK_DICT made by REDUCE of a dict class, else NULL */
            pk_value *state;      /* PK_DICT: BUILD state (OrderedDict's _metadata), or NULL */
            uint32_t cap;         /* allocated item slots (lists, sets, dicts grow) */
        } c;
        const pk_global *global;
        struct {
            pk_value *fn; /* a PK_GLOBAL */
            pk_value *args;
            pk_value *kwargs; /* NEWOBJ_EX only */
            pk_value *state;  /* from BUILD, or NULL */
        } call;
        pk_value *persid;
        const void *record; /* PK_RECORD: the caller's data */
    } u;
};

/* flags: PK_SHARED: the value may be reached more than once (memo fetches, DUP). PK_CONST: one
 * node of the document stands for every None, True, False and BININT1 integer (0..255) of the
 * pickle, so a list of millions of them costs a pointer an item, not a node (its pos is the
 * first occurrence's). Never recycled, never changed, and not "shared" for hooks: a hook sees
 * such a value as it sees any other. */
enum { PK_SHARED = 1, PK_CONST = 2 };
/* The constants' slots in pk_doc.consts: None, False, True, then the integers 0..255. */
enum {
    PK_CONST_NONE,
    PK_CONST_FALSE,
    PK_CONST_TRUE,
    PK_CONST_INT0,
    PK_CONSTS = PK_CONST_INT0 + 256
};

typedef struct pk_limits {
    size_t max_stack;  /* values on the stack at once */
    size_t max_marks;  /* nested MARKs */
    size_t max_values; /* values created + items stored in containers */
} pk_limits;

typedef struct pk_doc pk_doc;

/* Where a dict's new pair was set: the dict, and the stack under it (bottom first) — for a
 * dict filled inside a SETITEMS, the last of those is the key it will be stored under. */
typedef struct pk_pair_site {
    const pk_value *dict;
    pk_value *const *below;
    size_t nbelow;
} pk_pair_site;

typedef struct pk_hooks {
    void *ctx;
    /* Called for each pair DICT, SETITEM or SETITEMS sets, unless the value is shared. It may
     * replace *key (when not shared) and *value by values of its own (pk_new_record); the
     * parser then recycles the nodes only the replaced values held, so the hook must keep no
     * pointer to them (strings' bytes live in the pickle buffer and stay). A non-zero return
     * (a negative errno, with err filled) stops the parse with that error. */
    int (*on_pair)(void *ctx, pk_doc *doc, const pk_pair_site *site, pk_value **key,
                   pk_value **value, ckpt_err *err);
} pk_hooks;

typedef struct pk_options {
    const char *label; /* names the pickle in messages, e.g. "m.pt: archive/data.pkl" */
    uint64_t base;     /* file offset of the pickle's first byte, for messages */
    const pk_table *tables;
    size_t ntables;
    pk_limits limits;      /* zeros = defaults */
    const pk_hooks *hooks; /* or NULL */
} pk_options;

enum { PK_SPARE_CLASSES = 17 }; /* recycled item arrays of 1..16 slots */

struct pk_doc {
    arena mem;
    pk_value *root;
    size_t end; /* bytes consumed, up to and including STOP */
    size_t values;
    pk_value *spare_values;              /* recycled nodes */
    void *spare_items[PK_SPARE_CLASSES]; /* recycled item arrays by slot count */
    void **big;                          /* item arrays of more slots: malloc'd, grown in place */
    size_t nbig, cap_big;
    pk_value *consts[PK_CONSTS]; /* PK_CONST nodes, made when first met */
};

/* Parses one pickle from data[0, len) up to its STOP. On failure *doc is freed and the message
 * names the label, the opcode or value and its file offset. PK_ETRUNC means the data ended
 * before the STOP (a caller reading a window of a file may retry with a larger one). */
#define PK_ETRUNC (-ENODATA)
int pk_parse(pk_doc *doc, const char *data, size_t len, const pk_options *opt, ckpt_err *err);
void pk_free(pk_doc *doc);

/* A PK_RECORD standing for a value a hook has read; tag tells the caller's kinds apart, pos is
 * the offset messages name. NULL when out of memory. */
pk_value *pk_new_record(pk_doc *doc, uint32_t tag, const void *data, uint64_t pos);
static inline bool pk_shared(const pk_value *v) {
    return (v->flags & (PK_SHARED | PK_CONST)) == PK_SHARED;
}

/* Helpers for walkers. */
const char *pk_kind_name(pk_kind k);
/* The value of string key `key` in a PK_DICT, or NULL. */
const pk_value *pk_dict_get(const pk_value *dict, const char *key);
bool pk_is_str(const pk_value *v, const char *s);
/* The global a PK_CALL calls (NULL if v is not a call). */
const pk_global *pk_call_global(const pk_value *v);
/* "module.name" of a global into buf. */
const char *pk_global_name(const pk_global *g, char *buf, size_t size);

/* Appends v as JSON: None null, bools, ints (big ones as decimal strings), floats (shortest
 * round trip; inf/nan as strings), str, bytes as {"bytes": "<hex>"}, tuples/lists/sets as
 * arrays, dicts as objects (non-string keys become their JSON text), torch.Size as its list,
 * torch.device as "type:index", dtypes and other globals as {"global": "module.name"}, other
 * calls as {"call": "module.name", "args": [...], "state": ...}. Values nested deeper than 64
 * levels become a string saying so. *budget is the number of values that may still be visited;
 * it keeps shared or cyclic graphs from expanding without bound: false when it runs out.
 * The text grows by at most PK_JSON_MAX bytes: past it, the value reached becomes the string
 * "<truncated: ...>", the containers around it close, and the text stays valid JSON. */
enum { PK_JSON_MAX = 1 << 20 };
bool pk_to_json(strbuf *sb, const pk_value *v, size_t *budget);
/* The same within max_len bytes (a quarter, at most 4 KiB, is kept for the marker and the
 * closing brackets); *truncated (may
 * be NULL) tells whether something was cut. */
bool pk_to_json_within(strbuf *sb, const pk_value *v, size_t *budget, size_t max_len,
                       bool *truncated);

#endif
