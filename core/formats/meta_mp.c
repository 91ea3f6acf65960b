/* Meta's model-parallel checkpoints (the original Llama releases): consolidated.00.pth ...
 * consolidated.NN.pth, one torch.save file per model-parallel rank, and params.json. Each rank
 * holds its slice of every layer as fairscale's parallel layers cut them, and the tensors are
 * put back together on read, nothing copied:
 *
 *   column-parallel (output rows split, dim 0): attention.wq/wk/wv, feed_forward.w1/w3, output
 *   row-parallel (input columns split, dim 1):  attention.wo, feed_forward.w2
 *   ParallelEmbedding (embedding dim split, 1): tok_embeddings (Llama 3's VocabParallelEmbedding
 *                                               splits the vocabulary, dim 0: told by shape)
 *   replicated on every rank:                   the norms, rope.freqs — checked byte-equal
 *
 * The HF view is the checkpoint transformers' convert_llama_weights_to_hf.py would write: Llama
 * names, and q_proj/k_proj rows permuted for its rotary layout (per head, the even rows then the
 * odd ones), which is two strided pieces per head rather than a copy; config.json is made from
 * params.json. These view tensors are set aside under .ckptfs/llama/; the tree shows Meta's
 * own names. */
#include "../io/place.h"
#include "formats.h"
#include "../util/text.h"

#include "../util/hashmap.h"
#include "../util/json.h"
#include "../util/strbuf.h"
#include "torch_zip.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_RANKS = 1024, PARAMS_LIMIT = 1 << 20 };
#define VIEW_PREFIX ".ckptfs/llama/"

typedef struct rank_file {
    uint32_t source;
    const char *name; /* consolidated.NN.pth */
    torch_embedded e;
    hashmap by_name;
} rank_file;

typedef struct params {
    json_doc doc;
    char *text;
    bool parsed;
    uint64_t dim, n_layers, n_heads, n_kv_heads;
    const json_value *norm_eps, *rope_theta, *use_scaled_rope;
} params;

typedef struct meta {
    ckpt_catalog *cat;
    ckpt_err *err;
    rank_file *ranks;
    size_t nranks;
    params p;
    char params_path[PATH_MAX];
    bool vocab_parallel;   /* tok_embeddings split on dim 0 (Llama 3) */
    uint64_t vocab, inter; /* from the consolidated shapes, for config.json */
    const char *dtype;     /* of the weights, for config.json's torch_dtype */
} meta;

/* "consolidated.NN.pth" -> NN, or -1. */
static long rank_of(const char *name) {
    static const char head[] = "consolidated.", tail[] = ".pth";
    size_t n = strlen(name), h = sizeof head - 1, t = sizeof tail - 1;
    if (n <= h + t || strncmp(name, head, h) != 0 || strcmp(name + n - t, tail) != 0) return -1;
    long r = 0;
    for (size_t i = h; i < n - t; i++) {
        if (name[i] < '0' || name[i] > '9' || r > MAX_RANKS) return -1;
        r = r * 10 + (name[i] - '0');
    }
    return n - t - h >= 2 ? r : -1;
}

static bool is_file(const char *path) {
    return place_kind(path) == PLACE_FILE; /* a local path or a URL */
}

bool meta_mp_probe(const char *dir) {
    char path[PATH_MAX];
    int n = snprintf(path, sizeof path, "%s/params.json", dir);
    if (n < 0 || (size_t)n >= sizeof path || !is_file(path)) return false;
    n = snprintf(path, sizeof path, "%s/consolidated.00.pth", dir);
    return n > 0 && (size_t)n < sizeof path && is_file(path);
}

/* ---- params.json ---- */

static int param_u64(meta *m, const char *key, bool required, uint64_t *out) {
    const json_value *v = json_member(m->p.doc.root, key);
    if (!v || v->type == JSON_NULL) {
        if (!required) return 0;
        return ckpt_fail(m->err, -EINVAL,
                         "%s: no \"%s\" (Meta's params.json has n_layers, "
                         "n_heads, dim)",
                         m->params_path, key);
    }
    if (!json_as_u64(v, out) || *out == 0 || *out > (1ull << 32))
        return ckpt_fail(m->err, -EINVAL, "%s: \"%s\" is not a positive integer (byte offset %zu)",
                         m->params_path, key, v->pos);
    return 0;
}

static int read_params(meta *m) {
    ckpt_catalog *cat = m->cat;
    uint32_t src;
    int rc = catalog_add_source(cat, m->params_path, "params.json", &src, m->err);
    if (rc) return rc;
    uint64_t size = cat->sources[src].size;
    if (size > PARAMS_LIMIT)
        return ckpt_fail(m->err, -EFBIG, "%s: %llu bytes, over the 1 MiB a params.json may have",
                         m->params_path, (unsigned long long)size);
    if (!(m->p.text = malloc(size ? size : 1))) return ckpt_fail(m->err, -ENOMEM, "out of memory");
    if ((rc = ckpt_source_read(cat, src, 0, m->p.text, size, "params", m->err))) return rc;
    json_error jerr;
    if ((rc = json_parse(&m->p.doc, m->p.text, size, &jerr)))
        return ckpt_fail(m->err, rc, "%s: %s (byte offset %zu)", m->params_path, jerr.msg,
                         jerr.pos);
    m->p.parsed = true;
    if (m->p.doc.root->type != JSON_OBJECT)
        return ckpt_fail(m->err, -EINVAL, "%s: not a JSON object", m->params_path);
    /* Newer releases nest the model's parameters under "model" (the script reads it so). */
    const json_value *inner = json_member(m->p.doc.root, "model");
    if (inner && inner->type == JSON_OBJECT) m->p.doc.root = (json_value *)inner;
    if ((rc = param_u64(m, "dim", true, &m->p.dim)) ||
        (rc = param_u64(m, "n_layers", true, &m->p.n_layers)) ||
        (rc = param_u64(m, "n_heads", true, &m->p.n_heads)) ||
        (rc = param_u64(m, "n_kv_heads", false, &m->p.n_kv_heads)))
        return rc;
    if (!m->p.n_kv_heads) m->p.n_kv_heads = m->p.n_heads;
    uint64_t hd = m->p.dim / m->p.n_heads;
    if (m->p.dim % m->p.n_heads || hd % 2 || m->p.n_heads % m->p.n_kv_heads)
        return ckpt_fail(m->err, -EINVAL,
                         "%s: dim %llu, n_heads %llu, n_kv_heads %llu do not make an even head "
                         "size shared by whole key/value groups",
                         m->params_path, (unsigned long long)m->p.dim,
                         (unsigned long long)m->p.n_heads, (unsigned long long)m->p.n_kv_heads);
    m->p.norm_eps = json_member(m->p.doc.root, "norm_eps");
    m->p.rope_theta = json_member(m->p.doc.root, "rope_theta");
    m->p.use_scaled_rope = json_member(m->p.doc.root, "use_scaled_rope");
    if (!m->p.norm_eps) return ckpt_fail(m->err, -EINVAL, "%s: no \"norm_eps\"", m->params_path);
    const json_value *numbers[] = {m->p.norm_eps, m->p.rope_theta};
    for (size_t i = 0; i < 2; i++)
        if (numbers[i] && numbers[i]->type != JSON_NUMBER)
            return ckpt_fail(m->err, -EINVAL, "%s: \"%s\" is %s, not a number (byte offset %zu)",
                             m->params_path, numbers[i]->key, json_type_desc(numbers[i]->type),
                             numbers[i]->pos);
    return 0;
}

/* ---- the rank files ---- */

static int find_ranks(meta *m) {
    char **names;
    size_t n;
    int rc = dirlist_files(m->cat->root, ".pth", &names, &n);
    if (rc) return ckpt_fail(m->err, rc, "%s: cannot list: %s", m->cat->root, strerror(-rc));
    /* By rank number, not name order: consolidated.100.pth comes after consolidated.99.pth. */
    const char **by_rank = calloc(MAX_RANKS, sizeof *by_rank);
    size_t k = 0;
    if (!by_rank) rc = ckpt_fail(m->err, -ENOMEM, "out of memory");
    for (size_t i = 0; i < n && !rc; i++) {
        long r = rank_of(names[i]);
        if (r < 0) continue;
        if (r >= MAX_RANKS)
            rc = ckpt_fail(m->err, -E2BIG, "%s/%s: rank %ld, more than %d ranks", m->cat->root,
                           names[i], r, MAX_RANKS);
        else if (by_rank[r])
            rc = ckpt_fail(m->err, -EINVAL, "%s: %s and %s are both rank %ld", m->cat->root,
                           by_rank[r], names[i], r);
        else
            by_rank[r] = names[i];
        if ((size_t)r + 1 > k) k = (size_t)r + 1;
    }
    for (size_t i = 0; i < k && !rc; i++)
        if (!by_rank[i])
            rc = ckpt_fail(m->err, -ENOENT,
                           "%s/consolidated.%02zu.pth is missing: the model-parallel ranks go up "
                           "to %s, so every rank from 00 on must be there",
                           m->cat->root, i, by_rank[k - 1]);
    if (!rc && !(m->ranks = calloc(k ? k : 1, sizeof *m->ranks)))
        rc = ckpt_fail(m->err, -ENOMEM, "out of memory");
    for (size_t i = 0; i < k && !rc; i++) {
        char path[PATH_MAX];
        int w = snprintf(path, sizeof path, "%s/%s", m->cat->root, by_rank[i]);
        if (w < 0 || (size_t)w >= sizeof path) {
            rc = ckpt_fail(m->err, -ENAMETOOLONG, "%s/%s: path too long", m->cat->root, by_rank[i]);
            break;
        }
        rank_file *f = &m->ranks[i];
        if ((rc = catalog_add_source(m->cat, path, by_rank[i], &f->source, m->err))) break;
        m->nranks++;
        f->name = m->cat->sources[f->source].relpath;
        uint64_t size = m->cat->sources[f->source].size;
        if ((rc = torch_zip_read_embedded(m->cat, f->source, 0, size,
                                          m->cat->sources[f->source].path, "", 0, &f->e, m->err)))
            break;
        if (!hm_init(&f->by_name, f->e.ntensors + 1)) {
            rc = ckpt_fail(m->err, -ENOMEM, "out of memory");
            break;
        }
        for (size_t t = 0; t < f->e.ntensors && !rc; t++) {
            bool added;
            const torch_embedded_tensor *x = &f->e.tensors[t];
            if (!hm_put(&f->by_name, x->name, x->name_len, t, &added))
                rc = ckpt_fail(m->err, -ENOMEM, "out of memory");
        }
    }
    free(by_rank);
    dirlist_free(names, n);
    return rc;
}

/* ---- split dims ---- */

/* The name ends in tail as whole dotted components. */
static bool ends_with(const char *s, size_t n, const char *tail) {
    size_t t = strlen(tail);
    return text_mem_ends_with(s, n, tail) && (n == t || s[n - t - 1] == '.');
}

/* The dim fairscale's layer splits for this name, or -1 for a replicated tensor. */
static int split_dim(meta *m, const torch_embedded_tensor *x) {
    static const char *const column[] = {"attention.wq.weight",    "attention.wk.weight",
                                         "attention.wv.weight",    "feed_forward.w1.weight",
                                         "feed_forward.w3.weight", "output.weight"};
    static const char *const row[] = {"attention.wo.weight", "feed_forward.w2.weight"};
    for (size_t i = 0; i < sizeof column / sizeof *column; i++)
        if (ends_with(x->name, x->name_len, column[i])) return 0;
    for (size_t i = 0; i < sizeof row / sizeof *row; i++)
        if (ends_with(x->name, x->name_len, row[i])) return 1;
    if (ends_with(x->name, x->name_len, "tok_embeddings.weight")) {
        /* ParallelEmbedding keeps whole rows of dim/N; VocabParallelEmbedding whole rows of dim. */
        m->vocab_parallel = m->nranks > 1 && x->ndim == 2 && x->shape[1] == m->p.dim;
        return m->vocab_parallel ? 0 : 1;
    }
    return -1;
}

static bool same_bytes(meta *m, const torch_embedded_tensor *a, uint32_t sa,
                       const torch_embedded_tensor *b, uint32_t sb, uint64_t nbytes, int *rc) {
    enum { CHUNK = 1 << 16 };
    char *x = malloc(2 * CHUNK), *y = x + CHUNK;
    bool same = x != NULL;
    if (!x) *rc = ckpt_fail(m->err, -ENOMEM, "out of memory");
    for (uint64_t at = 0; same && at < nbytes; at += CHUNK) {
        size_t n = nbytes - at < CHUNK ? (size_t)(nbytes - at) : CHUNK;
        if ((*rc = ckpt_source_read(m->cat, sa, a->file_offset + at, x, n, "replicated tensor",
                                    m->err)) ||
            (*rc = ckpt_source_read(m->cat, sb, b->file_offset + at, y, n, "replicated tensor",
                                    m->err)))
            same = false;
        else
            same = memcmp(x, y, n) == 0;
    }
    free(x);
    return same;
}

static uint64_t elem_size(ckpt_dtype dt) {
    return ckpt_dtype_elem_size(dt);
}

/* The rank's tensor as a piece of the whole at `at` along dim d. */
static int add_rank_piece(meta *m, size_t index, const rank_file *f, const torch_embedded_tensor *x,
                          int d, uint64_t at) {
    uint64_t off[CKPT_MAX_DIMS] = {0};
    if (d >= 0) off[d] = at;
    return catalog_add_piece(m->cat, index, f->source, x->file_offset, off, x->shape,
                             x->row_major ? NULL : x->stride, m->err);
}

/* One tensor of rank 0 put together from every rank; *index is the catalog's. */
static int consolidate(meta *m, const torch_embedded_tensor *x0, size_t *index, int *dim_out) {
    int d = split_dim(m, x0);
    const rank_file *r0 = &m->ranks[0];
    if (d >= 0 && (uint32_t)d >= x0->ndim)
        return ckpt_fail(m->err, -EINVAL,
                         "%s: \"%.*s\" has %u dimensions, but Meta's layers split it on dim %d",
                         r0->name, SHOWN_NAME(x0->name, x0->name_len), x0->ndim, d);
    const torch_embedded_tensor *parts[MAX_RANKS];
    uint64_t shape[CKPT_MAX_DIMS];
    memcpy(shape, x0->shape, sizeof shape);
    for (size_t r = 0; r < m->nranks; r++) {
        const rank_file *f = &m->ranks[r];
        const hm_entry *he = hm_get(&f->by_name, x0->name, x0->name_len);
        if (!he)
            return ckpt_fail(m->err, -EINVAL, "%s: no tensor \"%.*s\", which %s has", f->name,
                             SHOWN_NAME(x0->name, x0->name_len), r0->name);
        const torch_embedded_tensor *x = &f->e.tensors[he->value];
        bool fits = x->dtype == x0->dtype && x->ndim == x0->ndim;
        for (uint32_t k = 0; fits && k < x->ndim; k++) fits = x->shape[k] == x0->shape[k];
        if (!fits)
            return ckpt_fail(
                m->err, -EINVAL,
                "%s: \"%.*s\" is %s %s than in %s: the ranks' slices of a "
                "model-parallel layer have one shape and dtype",
                f->name, SHOWN_NAME(x0->name, x0->name_len), ckpt_dtype_info_of(x->dtype)->name,
                x->ndim != x0->ndim ? "with other dimensions" : "of another shape", r0->name);
        parts[r] = x;
        if (d >= 0 && r) shape[d] += x0->shape[d];
    }
    if (d < 0) {
        uint64_t numel, nbytes;
        if (!catalog_shape_nbytes(x0->shape, x0->ndim, x0->dtype, &numel, &nbytes) ||
            !x0->row_major)
            return ckpt_fail(m->err, -EINVAL, "%s: replicated \"%.*s\" is not a plain tensor",
                             r0->name, SHOWN_NAME(x0->name, x0->name_len));
        for (size_t r = 1; r < m->nranks; r++) {
            int rc = 0;
            bool same = parts[r]->row_major &&
                        same_bytes(m, x0, r0->source, parts[r], m->ranks[r].source, nbytes, &rc);
            if (rc) return rc;
            if (!same)
                return ckpt_fail(m->err, -EINVAL,
                                 "%s: \"%.*s\" differs from %s's, but Meta's model-parallel "
                                 "layers replicate it on every rank",
                                 m->ranks[r].name, SHOWN_NAME(x0->name, x0->name_len), r0->name);
        }
    }
    int rc = catalog_add_tensor(m->cat, x0->name, x0->name_len, x0->dtype, x0->ndim, shape, index,
                                m->err);
    for (size_t r = 0; !rc && r < (d >= 0 ? m->nranks : 1); r++)
        rc = add_rank_piece(m, *index, &m->ranks[r], parts[r], d, d >= 0 ? r * x0->shape[d] : 0);
    if (!rc && m->nranks > 1) {
        char extra[96];
        if (d >= 0)
            snprintf(extra, sizeof extra, "\"model_parallel\": {\"ranks\": %zu, \"dim\": %d}",
                     m->nranks, d);
        else
            snprintf(extra, sizeof extra,
                     "\"model_parallel\": {\"ranks\": %zu, \"replicated\": true}", m->nranks);
        rc = catalog_set_extra(m->cat, *index, extra, m->err);
    }
    *dim_out = d;
    return rc;
}

/* ---- the Llama-named view ---- */

typedef enum { AS_IS, PERMUTE_Q, PERMUTE_K } view_kind;

/* The name convert_llama_weights_to_hf.py gives a Meta tensor, or false for none. */
static bool hf_name(const char *name, size_t n, strbuf *out, view_kind *kind) {
    static const struct {
        const char *meta, *hf;
        view_kind kind;
    } layer[] = {
        {"attention.wq.weight", "self_attn.q_proj.weight", PERMUTE_Q},
        {"attention.wk.weight", "self_attn.k_proj.weight", PERMUTE_K},
        {"attention.wv.weight", "self_attn.v_proj.weight", AS_IS},
        {"attention.wo.weight", "self_attn.o_proj.weight", AS_IS},
        {"feed_forward.w1.weight", "mlp.gate_proj.weight", AS_IS},
        {"feed_forward.w2.weight", "mlp.down_proj.weight", AS_IS},
        {"feed_forward.w3.weight", "mlp.up_proj.weight", AS_IS},
        {"attention_norm.weight", "input_layernorm.weight", AS_IS},
        {"ffn_norm.weight", "post_attention_layernorm.weight", AS_IS},
    };
    static const struct {
        const char *meta, *hf;
    } top[] = {{"tok_embeddings.weight", "model.embed_tokens.weight"},
               {"norm.weight", "model.norm.weight"},
               {"output.weight", "lm_head.weight"}};
    sb_clear(out);
    *kind = AS_IS;
    for (size_t i = 0; i < sizeof top / sizeof *top; i++)
        if (strlen(top[i].meta) == n && memcmp(name, top[i].meta, n) == 0) {
            sb_puts(out, top[i].hf);
            return !out->failed;
        }
    /* layers.<i>.<rest> */
    if (n < 8 || memcmp(name, "layers.", 7) != 0) return false;
    size_t i = 7;
    while (i < n && name[i] >= '0' && name[i] <= '9') i++;
    if (i == 7 || i >= n || name[i] != '.') return false;
    for (size_t k = 0; k < sizeof layer / sizeof *layer; k++) {
        size_t len = strlen(layer[k].meta);
        if (n - i - 1 == len && memcmp(name + i + 1, layer[k].meta, len) == 0) {
            sb_puts(out, "model.");
            sb_put(out, name, i + 1);
            sb_puts(out, layer[k].hf);
            *kind = layer[k].kind;
            return !out->failed;
        }
    }
    return false;
}

/* permute(w, heads): rows of head h come as its even rows, then its odd ones. Row h*hd + j*half
 * + i of the view is row h*hd + 2*i + j of the weight: per head and parity, `half` rows with a
 * stride of two rows, inside the one rank that holds the head. */
static int add_permuted(meta *m, size_t view, const torch_embedded_tensor *const *parts,
                        uint64_t heads) {
    const torch_embedded_tensor *x0 = parts[0];
    uint64_t rows_r = x0->shape[0], cols = x0->shape[1], rows = rows_r * m->nranks;
    uint64_t hd = rows / heads, half = hd / 2, esz = elem_size(x0->dtype);
    if (rows % heads || hd % 2 || rows_r % hd)
        return ckpt_fail(m->err, -EINVAL,
                         "%s: \"%.*s\" has %llu rows per rank, which do not hold whole heads of "
                         "%llu rows (%llu heads over %zu ranks)",
                         m->ranks[0].name, SHOWN_NAME(x0->name, x0->name_len),
                         (unsigned long long)rows_r, (unsigned long long)hd,
                         (unsigned long long)heads, m->nranks);
    for (uint64_t h = 0; h < heads; h++) {
        uint64_t r = h * hd / rows_r, local = h * hd - r * rows_r;
        const torch_embedded_tensor *x = parts[r];
        for (uint64_t j = 0; j < 2; j++) {
            uint64_t off[2] = {h * hd + j * half, 0}, size[2] = {half, cols};
            uint64_t stride[2] = {2 * x->stride[0], x->stride[1]};
            uint64_t at = x->file_offset + (local + j) * x->stride[0] * esz;
            int rc =
                catalog_add_piece(m->cat, view, m->ranks[r].source, at, off, size, stride, m->err);
            if (rc) return rc;
        }
    }
    return 0;
}

static int add_view_tensor(meta *m, size_t model, int d, const torch_embedded_tensor *x0,
                           strbuf *name, view_kind kind) {
    const ckpt_tensor *t = &m->cat->tensors[model];
    uint64_t shape[CKPT_MAX_DIMS];
    memcpy(shape, t->shape, t->ndim * sizeof *shape);
    uint32_t ndim = t->ndim;
    size_t view;
    int rc =
        catalog_add_tensor(m->cat, name->data, name->len, t->dtype, ndim, shape, &view, m->err);
    if (rc) return rc;
    m->cat->tensors[view].hf_view = true;
    if ((rc = catalog_set_prefix(m->cat, view, VIEW_PREFIX, true, m->err))) return rc;
    const torch_embedded_tensor *parts[MAX_RANKS];
    for (size_t r = 0; r < m->nranks; r++)
        parts[r] =
            &m->ranks[r].e.tensors[hm_get(&m->ranks[r].by_name, x0->name, x0->name_len)->value];
    if (kind != AS_IS) {
        if (ndim != 2 || d != 0)
            return ckpt_fail(m->err, -EINVAL, "%s: \"%.*s\" is not a 2-d column-parallel weight",
                             m->ranks[0].name, SHOWN_NAME(x0->name, x0->name_len));
        return add_permuted(m, view, parts, kind == PERMUTE_Q ? m->p.n_heads : m->p.n_kv_heads);
    }
    for (size_t r = 0; !rc && r < (d >= 0 ? m->nranks : 1); r++)
        rc = add_rank_piece(m, view, &m->ranks[r], parts[r], d, d >= 0 ? r * x0->shape[d] : 0);
    return rc;
}

/* Checks a consolidated shape against params.json where the script relies on it. */
static int check_shape(meta *m, const ckpt_tensor *t, view_kind kind, const strbuf *hf) {
    uint64_t hd = m->p.dim / m->p.n_heads;
    uint64_t rows = kind == PERMUTE_Q ? m->p.n_heads * hd : m->p.n_kv_heads * hd;
    if (kind != AS_IS && (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != m->p.dim))
        return ckpt_fail(m->err, -EINVAL,
                         "%s: \"%.*s\" consolidates to [%llu, %llu] over %zu rank file(s), but "
                         "params.json (dim %llu, %llu heads, %llu key/value heads) needs [%llu, "
                         "%llu]: a rank file missing, or not this model's",
                         m->ranks[m->nranks - 1].name, SHOWN_NAME(t->name, t->name_len),
                         (unsigned long long)t->shape[0],
                         (unsigned long long)(t->ndim > 1 ? t->shape[1] : 0), m->nranks,
                         (unsigned long long)m->p.dim, (unsigned long long)m->p.n_heads,
                         (unsigned long long)m->p.n_kv_heads, (unsigned long long)rows,
                         (unsigned long long)m->p.dim);
    if (strcmp(hf->data, "model.embed_tokens.weight") == 0) {
        if (t->ndim != 2 || t->shape[1] != m->p.dim)
            return ckpt_fail(m->err, -EINVAL,
                             "%s: tok_embeddings.weight consolidates to %llu columns over %zu "
                             "rank file(s), but params.json's dim is %llu: a rank file missing, "
                             "or not this model's",
                             m->ranks[m->nranks - 1].name,
                             (unsigned long long)(t->ndim == 2 ? t->shape[1] : 0), m->nranks,
                             (unsigned long long)m->p.dim);
        m->vocab = t->shape[0];
        m->dtype = t->dtype == CKPT_BF16  ? "bfloat16"
                   : t->dtype == CKPT_F16 ? "float16"
                                          : "float32";
    }
    if (strstr(hf->data, "mlp.gate_proj.weight") && t->ndim == 2) m->inter = t->shape[0];
    return 0;
}

/* ---- config.json ---- */

static void put_number(strbuf *sb, const json_value *v, const char *fallback) {
    if (v && v->type == JSON_NUMBER)
        sb_put(sb, v->str, v->len);
    else
        sb_puts(sb, fallback);
}

/* What LlamaConfig(...).save_pretrained writes for the script's arguments (the keys a loader
 * reads). max_position_embeddings follows the script's table: Llama 3.1 (use_scaled_rope) 131072,
 * Llama 3 (a 128k vocabulary) 8192, older 4096 (Llama 2; a Llama 1 user sets 2048). */
static int make_config(meta *m) {
    bool v3 = m->vocab >= 128000;
    bool scaled = m->p.use_scaled_rope && m->p.use_scaled_rope->type == JSON_TRUE;
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "{\n  \"architectures\": [\n    \"LlamaForCausalLM\"\n  ],\n");
    sb_puts(&sb, "  \"attention_bias\": false,\n  \"attention_dropout\": 0.0,\n");
    sb_printf(&sb, "  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n", v3 ? 128000 : 1,
              v3 ? 128001 : 2);
    sb_printf(&sb, "  \"hidden_act\": \"silu\",\n  \"hidden_size\": %llu,\n",
              (unsigned long long)m->p.dim);
    sb_printf(&sb, "  \"initializer_range\": 0.02,\n  \"intermediate_size\": %llu,\n",
              (unsigned long long)m->inter);
    sb_printf(&sb, "  \"max_position_embeddings\": %d,\n  \"model_type\": \"llama\",\n",
              scaled ? 131072
              : v3   ? 8192
                     : 4096);
    sb_printf(&sb, "  \"num_attention_heads\": %llu,\n  \"num_hidden_layers\": %llu,\n",
              (unsigned long long)m->p.n_heads, (unsigned long long)m->p.n_layers);
    sb_printf(&sb, "  \"num_key_value_heads\": %llu,\n  \"pretraining_tp\": 1,\n",
              (unsigned long long)m->p.n_kv_heads);
    sb_puts(&sb, "  \"rms_norm_eps\": ");
    put_number(&sb, m->p.norm_eps, "1e-06");
    sb_puts(&sb, ",\n  \"rope_scaling\": null,\n  \"rope_theta\": ");
    put_number(&sb, m->p.rope_theta, "10000.0");
    sb_printf(&sb, ",\n  \"tie_word_embeddings\": false,\n  \"torch_dtype\": \"%s\",\n",
              m->dtype ? m->dtype : "float32");
    sb_printf(&sb, "  \"use_cache\": true,\n  \"vocab_size\": %llu\n}\n",
              (unsigned long long)m->vocab);
    int rc = sb.failed ? ckpt_fail(m->err, -ENOMEM, "out of memory") : 0;
    if (!rc) {
        m->cat->hf_config = arena_strdup(&m->cat->priv->mem, sb.data);
        if (!m->cat->hf_config) rc = ckpt_fail(m->err, -ENOMEM, "out of memory");
    }
    sb_free(&sb);
    return rc;
}

static int add_doc(meta *m) {
    strbuf sb;
    sb_init(&sb);
    sb_printf(&sb, "{\"model_parallel\": %zu, \"files\": [", m->nranks);
    for (size_t r = 0; r < m->nranks; r++) {
        if (r) sb_puts(&sb, ", ");
        sb_json_str(&sb, m->ranks[r].name, strlen(m->ranks[r].name));
    }
    sb_printf(&sb, "], \"tok_embeddings_split\": \"%s\", \"hf_view\": \"%s\"}",
              m->vocab_parallel ? "vocab (dim 0)" : "embedding (dim 1)",
              m->vocab && m->inter ? "llama" : "none");
    int rc = sb.failed ? ckpt_fail(m->err, -ENOMEM, "out of memory")
                       : catalog_add_doc(m->cat, "meta", sb.data, sb.len, m->err);
    sb_free(&sb);
    return rc;
}

static int load_all(meta *m) {
    int rc = snprintf(m->params_path, sizeof m->params_path, "%s/params.json", m->cat->root);
    if (rc < 0 || (size_t)rc >= sizeof m->params_path)
        return ckpt_fail(m->err, -ENAMETOOLONG, "%s: path too long", m->cat->root);
    if ((rc = read_params(m)) || (rc = find_ranks(m))) return rc;
    if (m->nranks == 0)
        return ckpt_fail(m->err, -ENOENT, "%s: no consolidated.NN.pth", m->cat->root);
    /* Every rank must hold exactly rank 0's names: the other direction here. */
    for (size_t r = 1; r < m->nranks; r++)
        for (size_t t = 0; t < m->ranks[r].e.ntensors; t++) {
            const torch_embedded_tensor *x = &m->ranks[r].e.tensors[t];
            if (!hm_get(&m->ranks[0].by_name, x->name, x->name_len))
                return ckpt_fail(m->err, -EINVAL, "%s: tensor \"%.*s\" is not in %s",
                                 m->ranks[r].name, SHOWN_NAME(x->name, x->name_len),
                                 m->ranks[0].name);
        }
    strbuf hf;
    sb_init(&hf);
    const rank_file *r0 = &m->ranks[0];
    size_t views = 0;
    for (size_t t = 0; t < r0->e.ntensors && !rc; t++) {
        const torch_embedded_tensor *x0 = &r0->e.tensors[t];
        size_t index;
        int d = -1;
        view_kind kind;
        if ((rc = consolidate(m, x0, &index, &d))) break;
        if (!hf_name(x0->name, x0->name_len, &hf, &kind)) continue;
        if (hf.failed) rc = ckpt_fail(m->err, -ENOMEM, "out of memory");
        if (!rc) rc = check_shape(m, &m->cat->tensors[index], kind, &hf);
        if (!rc) rc = add_view_tensor(m, index, d, x0, &hf, kind);
        views++;
    }
    sb_free(&hf);
    if (!rc && views && m->vocab && m->inter) rc = make_config(m);
    if (!rc && views && !(m->vocab && m->inter))
        catalog_warn(m->cat,
                     "%s: no tok_embeddings or feed_forward.w1 weights: no config.json "
                     "for the HF view",
                     m->cat->root);
    if (!rc) rc = add_doc(m);
    /* Files transformers keeps beside the weights (Meta ships tokenizer.model). */
    for (size_t i = 0; !rc && i < ckpt_hf_aux_count; i++) {
        char path[PATH_MAX];
        int w = snprintf(path, sizeof path, "%s/%s", m->cat->root, ckpt_hf_aux_names[i]);
        uint32_t src;
        if (w < 0 || (size_t)w >= sizeof path || !is_file(path)) continue;
        if (strcmp(ckpt_hf_aux_names[i], "config.json") == 0 && m->cat->hf_config) continue;
        if (!(rc = catalog_add_source(m->cat, path, ckpt_hf_aux_names[i], &src, m->err)))
            rc = catalog_add_aux(m->cat, ckpt_hf_aux_names[i], src, m->err);
    }
    return rc;
}

int meta_mp_load(ckpt_catalog *cat, ckpt_err *err) {
    meta m;
    memset(&m, 0, sizeof m);
    m.cat = cat;
    m.err = err;
    int rc = load_all(&m);
    for (size_t r = 0; r < m.nranks; r++) {
        torch_embedded_free(&m.ranks[r].e);
        hm_free(&m.ranks[r].by_name);
    }
    free(m.ranks);
    if (m.p.parsed) json_doc_free(&m.p.doc);
    free(m.p.text);
    return rc;
}

const ckpt_format format_meta_mp = {
    .name = "meta-mp",
    .label = "Meta model-parallel checkpoint",
    .probe_dir = meta_mp_probe,
    .load_dir = meta_mp_load,
    .dir_looks_for = "Meta consolidated.00.pth + params.json",
};
