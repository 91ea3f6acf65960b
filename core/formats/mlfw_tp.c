/* MLFramework tensor-parallel checkpoints (C# BinaryWriter): a directory with metadata.bin and
 * shard_rank{N}.pt, or one centralized file holding the metadata and every rank's shard.
 *
 * The format records no split dimension, and its reference reader cannot read its own
 * metadata (it reads the fields in another order than the writer writes them). Choices here,
 * following the shared format notes:
 * - metadata is decoded in the writer's order; the reader's order is accepted only when the
 *   writer's cannot fit; trailing bytes are ignored (the writer does not truncate);
 * - ranks are the shard_rank*.pt files present (the world-size field is unreliable);
 * - a payload is float32 whatever its dtype tag says when its length says so (the writer
 *   always copies float32 data); the sidecar records the tag;
 * - consolidated tensors: identical bytes on every rank = replicated; otherwise the split
 *   dimension comes from -o tp_split=GLOB:DIM, else from layer-name rules (row-parallel
 *   layers dim 1, column-parallel dim 0), else dim 0 marked "guessed";
 * - every rank's tensors are also shown as they are under .ckptfs/ranks/N/. */
#include "../io/place.h"
#include "formats.h"
#include "../util/le.h"

#include "../util/hashmap.h"
#include "../util/strbuf.h"
#include "../util/utf8.h"

#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

enum { MAX_MESH = 64, MAX_NAME = 1 << 20, MAX_RANKS = 4096 };

typedef struct reader {
    const ckpt_catalog *cat;
    uint32_t source;
    uint64_t pos, end;
    ckpt_err *err;
} reader;

static int rd(reader *r, void *out, size_t n, const char *field) {
    if (n > r->end - r->pos)
        return ckpt_fail(r->err, -EINVAL, "%s: %s at offset %llu runs past the end (%llu)",
                         r->cat->sources[r->source].path, field, (unsigned long long)r->pos,
                         (unsigned long long)r->end);
    int rc = ckpt_source_read(r->cat, r->source, r->pos, out, n, field, r->err);
    if (!rc) r->pos += n;
    return rc;
}

static int rd_i32(reader *r, int32_t *v, const char *field) {
    unsigned char b[4];
    int rc = rd(r, b, 4, field);
    if (!rc) *v = (int32_t)le32(b);
    return rc;
}

static int rd_i64(reader *r, int64_t *v, const char *field) {
    unsigned char b[8];
    int rc = rd(r, b, 8, field);
    if (!rc) *v = (int64_t)le64(b);
    return rc;
}

static int bad_at(reader *r, uint64_t at, const char *field, const char *problem, long long v) {
    return ckpt_fail(r->err, -EINVAL, "%s: %s %lld at offset %llu %s",
                     r->cat->sources[r->source].path, field, v, (unsigned long long)at, problem);
}

/* BinaryWriter.Write(string): 7-bit encoded byte count (at most 5 bytes), then UTF-8. */
static int rd_string(reader *r, arena *mem, char **out, size_t *len, const char *field) {
    uint64_t at = r->pos;
    uint32_t n = 0;
    for (int i = 0; i < 5; i++) {
        unsigned char b;
        int rc = rd(r, &b, 1, field);
        if (rc) return rc;
        if (i == 4 && b > 0x0F)
            return bad_at(r, at, field, "has a malformed 7-bit length (5th byte over 0x0F)", b);
        n |= (uint32_t)(b & 0x7F) << (7 * i);
        if (!(b & 0x80)) break;
        if (i == 4)
            return bad_at(r, at, field, "has a malformed 7-bit length (more than 5 bytes)", b);
    }
    if (n > MAX_NAME || n > r->end - r->pos)
        return bad_at(r, at, field, "length runs past the end of the data", n);
    char *s = arena_alloc(mem, (size_t)n + 1);
    if (!s) return ckpt_fail(r->err, -ENOMEM, "out of memory");
    int rc = rd(r, s, n, field);
    if (rc) return rc;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq_len((const unsigned char *)s + i, n - i);
        if (!k) return bad_at(r, at, field, "is not valid UTF-8 (byte length shown)", n);
        i += k;
    }
    *out = s;
    *len = n;
    return 0;
}

typedef struct metadata {
    char *model_name;
    size_t model_name_len;
    int64_t saved_at;
    int32_t world_size, version, mesh_len;
    int32_t mesh[MAX_MESH];
    bool reader_order; /* decoded in the C# reader's order, not the writer's */
} metadata;

static int read_metadata(reader *r, arena *mem, metadata *m, bool allow_reader_order) {
    int rc = rd_string(r, mem, &m->model_name, &m->model_name_len, "ModelName");
    if (!rc) rc = rd_i64(r, &m->saved_at, "SavedAt");
    if (!rc) rc = rd_i32(r, &m->world_size, "TPWorldSize");
    if (rc) return rc;
    uint64_t at = r->pos;
    int32_t a, b;
    if ((rc = rd_i32(r, &a, "MeshShape length")) || (rc = rd_i32(r, &b, "Version/mesh"))) return rc;
    /* The writer's order is mesh length, mesh dims, version; the reader's is version, mesh
     * length, mesh dims. An exact fit decides; otherwise the writer's order with trailing bytes
     * (the writer does not truncate), then the reader's. */
    uint64_t left = r->end - at;
    bool writer_fits = a >= 0 && a <= MAX_MESH && (uint64_t)a * 4 + 8 <= left;
    bool reader_fits = allow_reader_order && b >= 0 && b <= MAX_MESH && (uint64_t)b * 4 + 8 <= left;
    bool use_reader = reader_fits && (!writer_fits ||
                                      ((uint64_t)a * 4 + 8 != left && (uint64_t)b * 4 + 8 == left));
    if (use_reader) {
        m->version = a;
        m->mesh_len = b;
        m->reader_order = true;
        for (int32_t i = 0; i < b && !rc; i++) rc = rd_i32(r, &m->mesh[i], "MeshShape");
        return rc;
    }
    if (writer_fits) {
        m->mesh_len = a;
        r->pos = at + 4;
        for (int32_t i = 0; i < a && !rc; i++) rc = rd_i32(r, &m->mesh[i], "MeshShape");
        if (!rc) rc = rd_i32(r, &m->version, "Version");
        return rc;
    }
    return bad_at(r, at, "MeshShape length", "is negative, over 64 or runs past the end", a);
}

typedef struct entry {
    char *name;
    size_t name_len;
    uint32_t ndim;
    uint64_t shape[CKPT_MAX_DIMS];
    int32_t tag;
    ckpt_dtype dtype;
    bool f32_payload; /* the tag says otherwise, the length says float32 */
    uint64_t offset, nbytes;
    uint32_t source;
} entry;

typedef struct shard {
    entry *entries;
    size_t count;
} shard;

static const struct {
    const char *name;
    ckpt_dtype dtype;
} tags[] = {{"Float32", CKPT_F32},
            {"Float64", CKPT_F64},
            {"Int32", CKPT_I32},
            {"Int64", CKPT_I64},
            {"Float16", CKPT_F16}};

/* One shard (a shard_rank file, or a blob of the centralized file): int32 count, then entries
 * { string name; int32 rank; int32 dims[rank]; int32 dtype; int32 length; bytes }. */
static int read_shard(reader *r, arena *mem, shard *out) {
    uint64_t at = r->pos;
    int32_t count;
    int rc = rd_i32(r, &count, "tensor count");
    if (rc) return rc;
    /* The smallest entry is 13 bytes: that bounds what the data can hold. */
    if (count < 0 || (uint64_t)count > (r->end - r->pos) / 13)
        return bad_at(r, at, "tensor count", "is negative or more than the data can hold", count);
    out->count = (size_t)count;
    out->entries = arena_array(mem, out->count ? out->count : 1, sizeof *out->entries);
    if (!out->entries) return ckpt_fail(r->err, -ENOMEM, "out of memory");
    for (size_t i = 0; i < out->count; i++) {
        entry *e = &out->entries[i];
        e->source = r->source;
        if ((rc = rd_string(r, mem, &e->name, &e->name_len, "tensor name"))) return rc;
        int32_t ndim, len;
        at = r->pos;
        if ((rc = rd_i32(r, &ndim, "rank"))) return rc;
        if (ndim < 0 || ndim > CKPT_MAX_DIMS)
            return bad_at(r, at, "rank (number of dims)", "is negative or over 32", ndim);
        e->ndim = (uint32_t)ndim;
        uint64_t numel = 1;
        for (uint32_t d = 0; d < e->ndim; d++) {
            int32_t dim;
            at = r->pos;
            if ((rc = rd_i32(r, &dim, "dim"))) return rc;
            if (dim < 0) return bad_at(r, at, "dim", "is negative", dim);
            e->shape[d] = (uint64_t)dim;
            if (__builtin_mul_overflow(numel, e->shape[d], &numel))
                return bad_at(r, at, "dim", "overflows the element count", dim);
        }
        at = r->pos;
        if ((rc = rd_i32(r, &e->tag, "dtype"))) return rc;
        if (e->tag < 0 || e->tag >= (int32_t)(sizeof tags / sizeof *tags))
            return bad_at(r, at, "dtype", "is not a TensorDataType (0-4)", e->tag);
        e->dtype = tags[e->tag].dtype;
        at = r->pos;
        if ((rc = rd_i32(r, &len, "data_length"))) return rc;
        if (len < 0 || (uint64_t)len > r->end - r->pos)
            return bad_at(r, at, "data_length", "is negative or runs past the end", len);
        uint64_t want = numel * ckpt_dtype_elem_size(e->dtype); /* numel < 2^31 * ... fits */
        if (numel > (uint64_t)INT32_MAX)
            return ckpt_fail(r->err, -EINVAL,
                             "%s: tensor \"%.*s\": dims hold %llu elements, more than a C# "
                             "array can (data_length field at offset %llu)",
                             r->cat->sources[r->source].path, SHOWN_NAME(e->name, e->name_len),
                             (unsigned long long)numel, (unsigned long long)at);
        if ((uint64_t)len != want) {
            if ((uint64_t)len != numel * 4)
                return ckpt_fail(r->err, -EINVAL,
                                 "%s: tensor \"%.*s\": data_length %d at offset %llu is neither "
                                 "numel x %s size (%llu) nor numel x 4",
                                 r->cat->sources[r->source].path, SHOWN_NAME(e->name, e->name_len),
                                 len, (unsigned long long)at, tags[e->tag].name,
                                 (unsigned long long)want);
            e->dtype = CKPT_F32;
            e->f32_payload = true;
        }
        e->offset = r->pos;
        e->nbytes = (uint64_t)len;
        r->pos += (uint64_t)len;
    }
    return 0;
}

/* ---- consolidation rules ---- */

typedef struct split_rule {
    char *glob;
    uint32_t dim;
} split_rule;

static int parse_tp_split(const char *text, arena *mem, split_rule **out, size_t *n,
                          ckpt_err *err) {
    *out = NULL;
    *n = 0;
    if (!text || !*text) return 0;
    size_t cap = 1;
    for (const char *c = text; *c; c++) cap += *c == ',' || *c == ';';
    split_rule *rules = arena_array(mem, cap, sizeof *rules);
    if (!rules) return ckpt_fail(err, -ENOMEM, "out of memory");
    const char *s = text;
    for (;;) {
        /* ';' separates rules too: a ',' inside -o must be written "\,". */
        const char *end = strpbrk(s, ",;");
        size_t len = end ? (size_t)(end - s) : strlen(s);
        const char *colon = NULL;
        for (size_t i = 0; i < len; i++)
            if (s[i] == ':') colon = s + i;
        char *stop;
        unsigned long dim = colon ? strtoul(colon + 1, &stop, 10) : 0;
        if (!colon || colon == s || stop != s + len || colon + 1 == stop || dim >= CKPT_MAX_DIMS)
            return ckpt_fail(err, -EINVAL,
                             "tp_split: \"%.*s\" is not GLOB:DIM (e.g. "
                             "'*.o_proj.weight:1')",
                             (int)len, s);
        rules[*n].glob = arena_memdup(mem, s, (size_t)(colon - s));
        rules[*n].dim = (uint32_t)dim;
        if (!rules[*n].glob) return ckpt_fail(err, -ENOMEM, "out of memory");
        (*n)++;
        if (!end) break;
        s = end + 1;
    }
    *out = rules;
    return 0;
}

/* Layer names (Megatron, HF tensor-parallel plans): row-parallel layers split the input
 * dimension (dim 1), column-parallel ones the output dimension (dim 0). */
static const char *const row_layers[] = {"o_proj",     "out_proj",    "down_proj", "dense_4h_to_h",
                                         "linear_fc2", "linear_proj", "fc2"};
static const char *const col_layers[] = {
    "q_proj",     "k_proj",          "v_proj",     "gate_proj", "up_proj",
    "fc1",        "dense_h_to_4h",   "linear_fc1", "lm_head",   "output_layer",
    "linear_qkv", "query_key_value", "wte"};
static const char *const row_parts[] = {"Row", "InputParallel"};
static const char *const col_parts[] = {"Column", "OutputParallel", "qkv", "embed"};

static bool component_is(const char *name, size_t len, const char *word) {
    size_t w = strlen(word);
    for (size_t s = 0, i = 0; i <= len; i++) {
        if (i == len || name[i] == '.') {
            if (i - s == w && memcmp(name + s, word, w) == 0) return true;
            s = i + 1;
        }
    }
    return false;
}

static bool contains(const char *name, size_t len, const char *part) {
    size_t p = strlen(part);
    for (size_t i = 0; i + p <= len; i++)
        if (memcmp(name + i, part, p) == 0) return true;
    return false;
}

/* The split dimension by name, or -1. *why gets the rule. */
static int dim_by_name(const char *name, size_t len, uint32_t ndim, const char **why) {
    for (size_t i = 0; i < sizeof row_layers / sizeof *row_layers; i++)
        if (component_is(name, len, row_layers[i])) return *why = row_layers[i], ndim >= 2 ? 1 : 0;
    if (contains(name, len, "attention.dense") && !contains(name, len, "attention.dense_"))
        return *why = "attention.dense", ndim >= 2 ? 1 : 0;
    for (size_t i = 0; i < sizeof row_parts / sizeof *row_parts; i++)
        if (contains(name, len, row_parts[i])) return *why = row_parts[i], ndim >= 2 ? 1 : 0;
    for (size_t i = 0; i < sizeof col_layers / sizeof *col_layers; i++)
        if (component_is(name, len, col_layers[i])) return *why = col_layers[i], 0;
    for (size_t i = 0; i < sizeof col_parts / sizeof *col_parts; i++)
        if (contains(name, len, col_parts[i])) return *why = col_parts[i], 0;
    return -1;
}

/* True when every rank holds the same bytes: compared in 1 MiB blocks. */
static int same_bytes(const ckpt_catalog *cat, const entry *const *e, size_t n, bool *same,
                      ckpt_err *err) {
    *same = true;
    for (size_t r = 1; r < n; r++)
        if (e[r]->ndim != e[0]->ndim || e[r]->nbytes != e[0]->nbytes ||
            memcmp(e[r]->shape, e[0]->shape, e[0]->ndim * sizeof(uint64_t)) != 0) {
            *same = false;
            return 0;
        }
    if (n < 2 || e[0]->nbytes == 0) return 0;
    enum { BLOCK = 1 << 20 };
    /* sized to the tensor: most tensors are small, and this runs once per tensor */
    size_t block = e[0]->nbytes < BLOCK ? (size_t)e[0]->nbytes : BLOCK;
    unsigned char *a = malloc(block), *b = malloc(block);
    int rc = a && b ? 0 : ckpt_fail(err, -ENOMEM, "out of memory");
    for (uint64_t off = 0; !rc && *same && off < e[0]->nbytes; off += block) {
        size_t len = e[0]->nbytes - off < block ? (size_t)(e[0]->nbytes - off) : block;
        rc = ckpt_source_read(cat, e[0]->source, e[0]->offset + off, a, len, "tensor data", err);
        for (size_t r = 1; !rc && *same && r < n; r++) {
            rc =
                ckpt_source_read(cat, e[r]->source, e[r]->offset + off, b, len, "tensor data", err);
            if (!rc && memcmp(a, b, len) != 0) *same = false;
        }
    }
    free(a);
    free(b);
    return rc;
}

static int add_extra(ckpt_catalog *cat, size_t idx, const entry *e, const char *rule, int dim,
                     bool guessed, size_t ranks, ckpt_err *err) {
    strbuf sb;
    sb_init(&sb);
    if (rule) {
        sb_puts(&sb, "\"split_rule\": ");
        sb_json_str(&sb, rule, strlen(rule));
        if (dim >= 0)
            sb_printf(&sb, ", \"split_dim\": %d", dim);
        else
            sb_puts(&sb, ", \"split_dim\": null");
        sb_printf(&sb, ", \"guessed\": %s, \"ranks\": %zu, ", guessed ? "true" : "false", ranks);
    }
    sb_printf(&sb, "\"mlframework_dtype\": \"%s\"", tags[e->tag].name);
    if (e->f32_payload) sb_puts(&sb, ", \"payload\": \"float32 (as the writer stores it)\"");
    int rc = sb.failed ? ckpt_fail(err, -ENOMEM, "out of memory")
                       : catalog_set_extra(cat, idx, sb.data, err);
    sb_free(&sb);
    return rc;
}

static int add_rank_copies(ckpt_catalog *cat, const shard *shards, size_t nranks, ckpt_err *err) {
    for (size_t r = 0; r < nranks; r++) {
        char prefix[48];
        snprintf(prefix, sizeof prefix, ".ckptfs/ranks/%zu/", r);
        for (size_t i = 0; i < shards[r].count; i++) {
            const entry *e = &shards[r].entries[i];
            size_t idx;
            int rc = catalog_add_tensor(cat, e->name, e->name_len, e->dtype, e->ndim, e->shape,
                                        &idx, err);
            if (!rc) rc = catalog_set_prefix(cat, idx, prefix, true, err);
            if (!rc) rc = catalog_add_piece(cat, idx, e->source, e->offset, NULL, NULL, NULL, err);
            if (!rc) rc = add_extra(cat, idx, e, NULL, -1, false, nranks, err);
            if (rc) return rc;
        }
    }
    return 0;
}

static int consolidate_one(ckpt_catalog *cat, const entry *const *e, size_t nranks,
                           const split_rule *rules, size_t nrules, ckpt_err *err) {
    const entry *e0 = e[0];
    bool same;
    int rc = same_bytes(cat, e, nranks, &same, err);
    if (rc) return rc;
    size_t idx;
    if (same) {
        rc = catalog_add_tensor(cat, e0->name, e0->name_len, e0->dtype, e0->ndim, e0->shape, &idx,
                                err);
        if (!rc) rc = catalog_add_piece(cat, idx, e0->source, e0->offset, NULL, NULL, NULL, err);
        if (!rc) rc = add_extra(cat, idx, e0, "replicated", -1, false, nranks, err);
        return rc;
    }
    char rule[160];
    int dim = -1;
    bool guessed = false;
    for (size_t i = 0; i < nrules && dim < 0; i++) {
        char *name = strndup(e0->name, e0->name_len);
        if (!name) return ckpt_fail(err, -ENOMEM, "out of memory");
        if (fnmatch(rules[i].glob, name, 0) == 0) {
            dim = (int)rules[i].dim;
            snprintf(rule, sizeof rule, "tp_split=%s:%u", rules[i].glob, rules[i].dim);
        }
        free(name);
    }
    const char *why = NULL;
    if (dim < 0 && (dim = dim_by_name(e0->name, e0->name_len, e0->ndim, &why)) >= 0) {
        snprintf(rule, sizeof rule, "name:%s", why);
        guessed = true;
    }
    if (dim < 0) {
        dim = 0;
        snprintf(rule, sizeof rule, "default");
        guessed = true;
    }
    if (e0->ndim == 0 || (uint32_t)dim >= e0->ndim)
        return ckpt_fail(err, -EINVAL,
                         "%s: tensor \"%.*s\" differs between ranks but has no dim %d to split on "
                         "(rule %s)",
                         cat->sources[e0->source].path, SHOWN_NAME(e0->name, e0->name_len), dim,
                         rule);
    uint64_t shape[CKPT_MAX_DIMS];
    memcpy(shape, e0->shape, e0->ndim * sizeof *shape);
    shape[dim] = 0;
    for (size_t r = 0; r < nranks; r++) {
        for (uint32_t d = 0; d < e0->ndim; d++)
            if (d != (uint32_t)dim && e[r]->shape[d] != e0->shape[d])
                return ckpt_fail(err, -EINVAL,
                                 "%s: tensor \"%.*s\": rank %zu has size %llu on dim %u, rank 0 "
                                 "has %llu; only dim %d (rule %s) may differ",
                                 cat->sources[e[r]->source].path,
                                 SHOWN_NAME(e0->name, e0->name_len), r,
                                 (unsigned long long)e[r]->shape[d], d,
                                 (unsigned long long)e0->shape[d], dim, rule);
        if (__builtin_add_overflow(shape[dim], e[r]->shape[dim], &shape[dim]))
            return ckpt_fail(err, -EOVERFLOW, "tensor \"%.*s\": consolidated shape overflows",
                             SHOWN_NAME(e0->name, e0->name_len));
    }
    rc = catalog_add_tensor(cat, e0->name, e0->name_len, e0->dtype, e0->ndim, shape, &idx, err);
    uint64_t offsets[CKPT_MAX_DIMS] = {0};
    for (size_t r = 0; !rc && r < nranks; r++) {
        rc = catalog_add_piece(cat, idx, e[r]->source, e[r]->offset, offsets, e[r]->shape, NULL,
                               err);
        offsets[dim] += e[r]->shape[dim];
    }
    if (!rc) rc = add_extra(cat, idx, e0, rule, dim, guessed, nranks, err);
    return rc;
}

static int consolidate(ckpt_catalog *cat, const shard *shards, size_t nranks, arena *mem,
                       ckpt_err *err) {
    split_rule *rules;
    size_t nrules;
    int rc = parse_tp_split(cat->opts.tp_split, mem, &rules, &nrules, err);
    if (rc) return rc;
    /* Names by rank: entry i of rank 0 is matched by name in the others. */
    hashmap *by_name = calloc(nranks, sizeof *by_name);
    const entry **row = calloc(nranks, sizeof *row);
    if (!by_name || !row) rc = ckpt_fail(err, -ENOMEM, "out of memory");
    for (size_t r = 0; !rc && r < nranks; r++) {
        if (!hm_init(&by_name[r], shards[r].count)) rc = ckpt_fail(err, -ENOMEM, "out of memory");
        for (size_t i = 0; !rc && i < shards[r].count; i++) {
            bool added;
            const entry *e = &shards[r].entries[i];
            if (!hm_put(&by_name[r], e->name, e->name_len, i, &added))
                rc = ckpt_fail(err, -ENOMEM, "out of memory");
            else if (!added)
                rc = ckpt_fail(err, -EINVAL, "%s: tensor \"%.*s\" appears twice",
                               cat->sources[e->source].path, SHOWN_NAME(e->name, e->name_len));
        }
    }
    /* Every name once, in rank order of first appearance. */
    size_t partial = 0;
    for (size_t first = 0; !rc && first < nranks; first++) {
        for (size_t i = 0; !rc && i < shards[first].count; i++) {
            const entry *e0 = &shards[first].entries[i];
            bool seen_before = false;
            for (size_t r = 0; r < first && !seen_before; r++)
                seen_before = hm_get(&by_name[r], e0->name, e0->name_len) != NULL;
            if (seen_before) continue;
            bool everywhere = true;
            for (size_t r = 0; r < nranks && everywhere; r++) {
                const hm_entry *h = hm_get(&by_name[r], e0->name, e0->name_len);
                if (!h)
                    everywhere = false;
                else
                    row[r] = &shards[r].entries[h->value];
                if (h && (row[r]->dtype != e0->dtype || row[r]->ndim != e0->ndim))
                    everywhere = false;
            }
            if (everywhere) {
                rc = consolidate_one(cat, row, nranks, rules, nrules, err);
            } else if (partial++ < 10) {
                catalog_warn(cat,
                             "tensor \"%.*s\" is not on every rank with one dtype and "
                             "rank: only in .ckptfs/ranks/",
                             SHOWN_NAME(e0->name, e0->name_len));
            }
        }
    }
    if (!rc && partial > 10)
        catalog_warn(cat, "%zu tensors in all are only in the per-rank trees", partial);
    for (size_t r = 0; by_name && r < nranks; r++) hm_free(&by_name[r]);
    free(by_name);
    free(row);
    return rc;
}

/* ---- metadata.json ---- */

static int metadata_doc(ckpt_catalog *cat, const metadata *m, size_t nranks, int32_t declared,
                        const char *layout, ckpt_err *err) {
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "{\"model_name\": ");
    sb_json_str(&sb, m->model_name, m->model_name_len);
    /* DateTime.ToBinary: 62 bits of 100 ns ticks since 0001-01-01, 2 bits of kind. */
    uint64_t raw = (uint64_t)m->saved_at, ticks = raw & ((1ull << 62) - 1);
    if ((raw >> 63) && ticks > 3155378975999999999ull) ticks -= 1ull << 62;
    time_t unix_s = (time_t)(((int64_t)ticks - 621355968000000000ll) / 10000000);
    struct tm tm;
    char when[48] = "";
    if (gmtime_r(&unix_s, &tm))
        snprintf(when, sizeof when, "%04d-%02d-%02dT%02d:%02d:%02dZ", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
    sb_printf(&sb, ", \"saved_at\": \"%s\", \"saved_at_binary\": %lld", when,
              (long long)m->saved_at);
    sb_printf(&sb, ", \"tp_world_size\": %d, \"ranks_found\": %zu, \"mesh_shape\": [",
              m->world_size, nranks);
    for (int32_t i = 0; i < m->mesh_len; i++) sb_printf(&sb, "%s%d", i ? ", " : "", m->mesh[i]);
    sb_printf(&sb, "], \"version\": %d, \"field_order\": \"%s\", \"layout\": \"%s\"", m->version,
              m->reader_order ? "reader" : "writer", layout);
    if (declared >= 0) sb_printf(&sb, ", \"declared_shards\": %d", declared);
    sb_putc(&sb, '}');
    int rc = sb.failed ? ckpt_fail(err, -ENOMEM, "out of memory")
                       : catalog_add_doc(cat, "mlframework", sb.data, sb.len, err);
    sb_free(&sb);
    return rc;
}

/* ---- directory form ---- */

/* N of "shard_rank{N}.pt": decimal digits only, no sign, no padding. */
static int rank_of(const char *name) {
    if (strncmp(name, "shard_rank", 10) != 0) return -1;
    const char *p = name + 10;
    int r = 0, digits = 0;
    for (; *p >= '0' && *p <= '9'; p++, digits++) {
        r = r * 10 + (*p - '0');
        if (r >= MAX_RANKS) return -1;
    }
    if (digits == 0 || (digits > 1 && name[10] == '0') || strcmp(p, ".pt") != 0) return -1;
    return r;
}

bool mlfw_tp_dir_probe(const char *dir) {
    char path[PATH_MAX];
    return snprintf(path, sizeof path, "%s/metadata.bin", dir) < (int)sizeof path &&
           place_kind(path) == PLACE_FILE &&
           snprintf(path, sizeof path, "%s/shard_rank0.pt", dir) < (int)sizeof path &&
           place_kind(path) == PLACE_FILE;
}

int mlfw_tp_dir_load(ckpt_catalog *cat, ckpt_err *err) {
    place_entry *ents;
    size_t nents;
    int lrc = place_list(cat->root, &ents, &nents);
    if (lrc) return ckpt_fail(err, lrc, "%s: %s", cat->root, strerror(-lrc));
    bool seen[MAX_RANKS] = {false};
    int max_rank = -1;
    for (size_t i = 0; i < nents; i++) {
        int r = rank_of(ents[i].name);
        if (r < 0) continue;
        seen[r] = true;
        if (r > max_rank) max_rank = r;
    }
    place_list_free(ents, nents);
    for (int r = 0; r <= max_rank; r++)
        if (!seen[r])
            return ckpt_fail(err, -ENOENT, "%s: shard_rank%d.pt is missing (ranks 0..%d expected)",
                             cat->root, r, max_rank);
    size_t nranks = (size_t)max_rank + 1;
    arena mem;
    arena_init(&mem);
    shard *shards = arena_array(&mem, nranks, sizeof *shards);
    int rc = shards ? 0 : ckpt_fail(err, -ENOMEM, "out of memory");
    char path[PATH_MAX], rel[64];
    metadata m = {0};
    uint32_t src;
    if (!rc && snprintf(path, sizeof path, "%s/metadata.bin", cat->root) >= (int)sizeof path)
        rc = ckpt_fail(err, -ENAMETOOLONG, "%s: path too long", cat->root);
    if (!rc) rc = catalog_add_source(cat, path, "metadata.bin", &src, err);
    if (!rc) {
        reader r = {cat, src, 0, cat->sources[src].size, err};
        rc = read_metadata(&r, &mem, &m, true);
    }
    for (size_t k = 0; !rc && k < nranks; k++) {
        snprintf(rel, sizeof rel, "shard_rank%zu.pt", k);
        if (snprintf(path, sizeof path, "%s/%s", cat->root, rel) >= (int)sizeof path)
            rc = ckpt_fail(err, -ENAMETOOLONG, "%s: path too long", cat->root);
        if (!rc) rc = catalog_add_source(cat, path, rel, &src, err);
        if (!rc) {
            reader r = {cat, src, 0, cat->sources[src].size, err};
            rc = read_shard(&r, &mem, &shards[k]);
            if (!rc && r.pos != r.end)
                catalog_warn(cat, "%s: %llu bytes after the last tensor", cat->sources[src].path,
                             (unsigned long long)(r.end - r.pos));
        }
    }
    if (!rc && m.world_size != (int32_t)nranks)
        catalog_warn(cat, "metadata.bin says TPWorldSize %d, %zu shard_rank files found",
                     m.world_size, nranks);
    if (!rc) rc = metadata_doc(cat, &m, nranks, -1, "directory", err);
    if (!rc) rc = consolidate(cat, shards, nranks, &mem, err);
    if (!rc) rc = add_rank_copies(cat, shards, nranks, err);
    arena_free(&mem);
    return rc;
}

/* ---- centralized file: metadata, int32 shard count, then { int32 size; shard } ... ---- */

static bool probe(const unsigned char *head, size_t n, uint64_t size) {
    /* No magic: the metadata must look right. A short model name, a UTC or unspecified
     * DateTime, a sane world size and mesh. */
    if (n < 2 || head[0] == 0 || head[0] >= 0x80) return false;
    size_t len = head[0], at = 1 + len;
    if (at + 8 + 4 + 4 > n || at + 24 > size) return false;
    for (size_t i = 1; i < at;) {
        size_t k = utf8_seq_len(head + i, at - i);
        if (!k || head[i] < 0x20) return false;
        i += k;
    }
    uint64_t dt = le64(head + at);
    if ((dt >> 62) > 1 || (dt & ((1ull << 62) - 1)) > 3155378975999999999ull) return false;
    at += 8;
    int32_t ws = (int32_t)le32(head + at), mesh = (int32_t)le32(head + at + 4);
    return ws >= 1 && ws <= MAX_RANKS && mesh >= 0 && mesh <= MAX_MESH;
}

static int load(ckpt_catalog *cat, uint32_t source, ckpt_err *err) {
    arena mem;
    arena_init(&mem);
    reader r = {cat, source, 0, cat->sources[source].size, err};
    metadata m = {0};
    int32_t declared = 0;
    int rc = read_metadata(&r, &mem, &m, false);
    uint64_t at = r.pos;
    if (!rc) rc = rd_i32(&r, &declared, "shard_count");
    if (!rc && (declared < 0 || declared > MAX_RANKS))
        rc = bad_at(&r, at, "shard_count", "is negative or over 4096", declared);
    shard *shards = rc ? NULL : arena_array(&mem, declared ? (size_t)declared : 1, sizeof *shards);
    if (!rc && !shards) rc = ckpt_fail(err, -ENOMEM, "out of memory");
    size_t present = 0;
    /* The writer declares world-size shards but writes only rank 0's: read until EOF. */
    while (!rc && present < (size_t)declared && r.pos < r.end) {
        int32_t blob;
        at = r.pos;
        if ((rc = rd_i32(&r, &blob, "shard size"))) break;
        if (blob < 0 || (uint64_t)blob > r.end - r.pos) {
            rc = bad_at(&r, at, "shard size", "is negative or runs past the end", blob);
            break;
        }
        reader sr = {cat, source, r.pos, r.pos + (uint64_t)blob, err};
        if ((rc = read_shard(&sr, &mem, &shards[present]))) break;
        r.pos += (uint64_t)blob;
        present++;
    }
    if (!rc && present == 0)
        rc = ckpt_fail(err, -EINVAL, "%s: shard_count %d at offset %llu but no shard follows",
                       cat->sources[source].path, declared, (unsigned long long)at);
    if (!rc && present < (size_t)declared)
        catalog_warn(cat, "%s: %d shards declared, %zu present (the writer stores only rank 0)",
                     cat->sources[source].path, declared, present);
    if (!rc) rc = metadata_doc(cat, &m, present, declared, "centralized", err);
    if (!rc) rc = consolidate(cat, shards, present, &mem, err);
    if (!rc && present > 1) rc = add_rank_copies(cat, shards, present, err);
    arena_free(&mem);
    return rc;
}

const ckpt_format format_mlfw_tp = {
    .name = "mlframework-tp",
    .label = "MLFramework",
    .probe = probe,
    .load = load,
    .probe_dir = mlfw_tp_dir_probe,
    .load_dir = mlfw_tp_dir_load,
    .dir_looks_for = "MLFramework metadata.bin + shard_rank0.pt",
    .no_magic = true,
};
