/* A Hugging Face Llama (Mistral, Qwen2) or GPT-2 folder as llama.cpp runs it from a GGUF file: the
 * tensors under llama.cpp's names, and the hyper-parameters and tokenizer as GGUF key-values (the
 * "gguf_kv" document the GGUF writer emits; gguf_vocab.c makes the tokenizer part).
 *
 * Llama: q_proj and k_proj rows are reordered from Hugging Face's rotate-half RoPE layout to
 * the interleaved pairs llama.cpp's "llama" rope uses (rows h*D + 2i + j come from
 * h*D + j*D/2 + i, D the head dimension): one piece per row of each stored piece, a view of the
 * same bytes, so chunks of a DCP or NeMo tensor and strided torch views need no copy.
 * GPT-2: the Conv1D weights, stored [in, out], become [out, in] as a strided view.
 * Buffers (rotary inv_freq and position_ids, attn.bias, attn.masked_bias) are left out; any
 * other tensor without a llama.cpp name is refused by name. */
#include "profile.h"

#include "../model/catalog.h"
#include "../formats/formats.h"
#include "../util/json.h"
#include "../util/strbuf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Mistral is a llama to llama.cpp's converter (arch "llama", q/k permuted); Qwen2 has its own
 * arch, q/k/v biases, and keeps Hugging Face's rotate-half rows (llama.cpp ropes it NEOX-style). */
enum { FAMILY_NONE, FAMILY_LLAMA, FAMILY_QWEN2, FAMILY_GPT2 };

typedef struct hparams {
    int family;
    uint64_t n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx, n_vocab, head_dim;
    const json_value *eps, *rope_theta, *rope_scaling;
} hparams;

static bool starts_with(const char *s, size_t n, const char *p) {
    size_t m = strlen(p);
    return n >= m && memcmp(s, p, m) == 0;
}

static bool eq(const char *s, size_t n, const char *p) {
    return strlen(p) == n && memcmp(s, p, n) == 0;
}

static uint64_t u64_or(const json_value *cfg, const char *key, uint64_t dflt) {
    uint64_t v;
    const json_value *m = json_member(cfg, key);
    return m && json_as_u64(m, &v) ? v : dflt;
}

/* The family's name, which is also its GGUF general.architecture. */
static const char *family_name(int family) {
    return family == FAMILY_GPT2 ? "gpt2" : family == FAMILY_QWEN2 ? "qwen2" : "llama";
}

static int read_hparams(const json_value *cfg, hparams *h, const char *root, ckpt_err *err) {
    memset(h, 0, sizeof *h);
    const json_value *mt = json_member(cfg, "model_type");
    if (json_str_eq(mt, "llama") || json_str_eq(mt, "mistral") || json_str_eq(mt, "qwen2")) {
        h->family = json_str_eq(mt, "qwen2") ? FAMILY_QWEN2 : FAMILY_LLAMA;
        h->n_embd = u64_or(cfg, "hidden_size", 0);
        h->n_layer = u64_or(cfg, "num_hidden_layers", 0);
        h->n_head = u64_or(cfg, "num_attention_heads", 0);
        h->n_head_kv = u64_or(cfg, "num_key_value_heads", h->n_head);
        h->n_ff = u64_or(cfg, "intermediate_size", 0);
        h->n_ctx = u64_or(cfg, "max_position_embeddings", 2048);
        h->head_dim = u64_or(cfg, "head_dim", h->n_head ? h->n_embd / h->n_head : 0);
        h->eps = json_member(cfg, "rms_norm_eps");
        h->rope_theta = json_member(cfg, "rope_theta");
        h->rope_scaling = json_member(cfg, "rope_scaling");
    } else if (json_str_eq(mt, "gpt2")) {
        h->family = FAMILY_GPT2;
        h->n_embd = u64_or(cfg, "n_embd", 0);
        h->n_layer = u64_or(cfg, "n_layer", 0);
        h->n_head = u64_or(cfg, "n_head", 0);
        h->n_ff = u64_or(cfg, "n_inner", 4 * h->n_embd);
        h->n_ctx = u64_or(cfg, "n_positions", u64_or(cfg, "n_ctx", 1024));
        h->eps = json_member(cfg, "layer_norm_epsilon");
        h->head_dim = h->n_head ? h->n_embd / h->n_head : 0;
    } else {
        return 0;
    }
    h->n_vocab = u64_or(cfg, "vocab_size", 0);
    if (!h->n_embd || !h->n_layer || !h->n_head || !h->n_ff || !h->head_dim ||
        (h->family != FAMILY_GPT2 &&
         (!h->n_head_kv || h->n_head % h->n_head_kv || h->head_dim % 2)))
        return ckpt_fail(err, -EINVAL,
                         "%s/config.json: the %s hyper-parameters are incomplete or "
                         "inconsistent (sizes, layers, heads)",
                         root, family_name(h->family));
    return 0;
}

/* "<prefix><digits>.<rest>": the layer number and the rest, or false. */
static bool layer_of(const char *s, size_t n, const char *prefix, unsigned long *layer,
                     const char **rest, size_t *rest_len) {
    if (!starts_with(s, n, prefix)) return false;
    size_t i = strlen(prefix), start = i;
    unsigned long v = 0;
    while (i < n && s[i] >= '0' && s[i] <= '9' && v < 100000)
        v = v * 10 + (unsigned long)(s[i++] - '0');
    if (i == start || i >= n || s[i] != '.') return false;
    *layer = v;
    *rest = s + i + 1;
    *rest_len = n - i - 1;
    return true;
}

typedef struct mapped {
    char name[64];
    int permute_heads; /* > 0: q/k rows reordered for that many heads */
    bool transpose;    /* GPT-2 Conv1D */
    bool skip;         /* a buffer, not a parameter */
} mapped;

static bool map_llama(const char *s, size_t n, const hparams *h, mapped *m) {
    static const struct {
        const char *hf, *gg;
    } layer_names[] = {
        {"input_layernorm.weight", "attn_norm.weight"},
        {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.k_proj.weight", "attn_k.weight"},
        {"self_attn.v_proj.weight", "attn_v.weight"},
        {"self_attn.o_proj.weight", "attn_output.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},
        {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
        {"self_attn.q_proj.bias", "attn_q.bias"}, /* Qwen2's */
        {"self_attn.k_proj.bias", "attn_k.bias"},
        {"self_attn.v_proj.bias", "attn_v.bias"},
    };
    memset(m, 0, sizeof *m);
    if (eq(s, n, "model.embed_tokens.weight")) return snprintf(m->name, 64, "token_embd.weight");
    if (eq(s, n, "model.norm.weight")) return snprintf(m->name, 64, "output_norm.weight");
    if (eq(s, n, "lm_head.weight")) return snprintf(m->name, 64, "output.weight");
    /* RoPE buffers (inv_freq, position_ids), which llama.cpp computes itself */
    if (memmem(s, n, "rotary", 6) &&
        (n > 9 && (!memcmp(s + n - 9, ".inv_freq", 9) ||
                   (n > 13 && !memcmp(s + n - 13, ".position_ids", 13)))))
        return m->skip = true;
    unsigned long L;
    const char *rest;
    size_t rl;
    if (!layer_of(s, n, "model.layers.", &L, &rest, &rl)) return false;
    for (size_t i = 0; i < sizeof layer_names / sizeof *layer_names; i++)
        if (eq(rest, rl, layer_names[i].hf)) {
            snprintf(m->name, 64, "blk.%lu.%s", L, layer_names[i].gg);
            bool rows_permuted = h->family == FAMILY_LLAMA; /* Qwen2 keeps HF's rows */
            if (i == 2 && rows_permuted) m->permute_heads = (int)h->n_head;
            if (i == 3 && rows_permuted) m->permute_heads = (int)h->n_head_kv;
            return true;
        }
    return false;
}

static bool map_gpt2(const char *s, size_t n, mapped *m) {
    static const struct {
        const char *hf, *gg;
        bool transpose;
    } layer_names[] = {
        {"ln_1.weight", "attn_norm.weight", false},
        {"ln_1.bias", "attn_norm.bias", false},
        {"attn.c_attn.weight", "attn_qkv.weight", true},
        {"attn.c_attn.bias", "attn_qkv.bias", false},
        {"attn.c_proj.weight", "attn_output.weight", true},
        {"attn.c_proj.bias", "attn_output.bias", false},
        {"ln_2.weight", "ffn_norm.weight", false},
        {"ln_2.bias", "ffn_norm.bias", false},
        {"mlp.c_fc.weight", "ffn_up.weight", true},
        {"mlp.c_fc.bias", "ffn_up.bias", false},
        {"mlp.c_proj.weight", "ffn_down.weight", true},
        {"mlp.c_proj.bias", "ffn_down.bias", false},
    };
    memset(m, 0, sizeof *m);
    if (starts_with(s, n, "transformer.")) s += 12, n -= 12;
    if (eq(s, n, "wte.weight")) return snprintf(m->name, 64, "token_embd.weight");
    if (eq(s, n, "wpe.weight")) return snprintf(m->name, 64, "position_embd.weight");
    if (eq(s, n, "ln_f.weight")) return snprintf(m->name, 64, "output_norm.weight");
    if (eq(s, n, "ln_f.bias")) return snprintf(m->name, 64, "output_norm.bias");
    if (eq(s, n, "lm_head.weight")) return snprintf(m->name, 64, "output.weight");
    unsigned long L;
    const char *rest;
    size_t rl;
    if (!layer_of(s, n, "h.", &L, &rest, &rl)) return false;
    if (eq(rest, rl, "attn.bias") || eq(rest, rl, "attn.masked_bias")) return m->skip = true;
    for (size_t i = 0; i < sizeof layer_names / sizeof *layer_names; i++)
        if (eq(rest, rl, layer_names[i].hf)) {
            snprintf(m->name, 64, "blk.%lu.%s", L, layer_names[i].gg);
            m->transpose = layer_names[i].transpose;
            return true;
        }
    return false;
}

/* A 2-dim piece as a box of the tensor: first row and column, rows and columns, and the
 * element strides of its rows and columns in the file (row-major when the piece has none). */
typedef struct box {
    uint64_t row, col, rows, cols, srow, scol;
} box;

static box box_of(const ckpt_tensor *t, const ckpt_piece *p) {
    box b = {p->offsets ? p->offsets[0] : 0,
             p->offsets ? p->offsets[1] : 0,
             p->sizes ? p->sizes[0] : t->shape[0],
             p->sizes ? p->sizes[1] : t->shape[1],
             0,
             1};
    b.srow = p->strides ? p->strides[0] : b.cols;
    if (p->strides) b.scol = p->strides[1];
    return b;
}

/* The tensor under llama.cpp's name: as it is, transposed (GPT-2's Conv1D) or with the q/k rows
 * in llama.cpp's rope order. Each piece of the source (a rank's chunk of a DCP or NeMo tensor,
 * a strided torch view, a whole safetensors tensor) is carried over as pieces of the new
 * tensor at the same bytes, so any layout is assembled while it is written. */
static int add_mapped(ckpt_catalog *out, const ckpt_tensor *t, const mapped *m, ckpt_err *err) {
    size_t idx;
    size_t len = strlen(m->name);
    int rc;
    if (!m->permute_heads && !m->transpose) {
        rc = catalog_add_tensor(out, m->name, len, t->dtype, t->ndim, t->shape, &idx, err);
        for (uint32_t k = 0; !rc && k < t->npieces; k++) {
            const ckpt_piece *p = &t->pieces[k];
            rc = catalog_add_piece(out, idx, p->source, p->file_offset, p->offsets, p->sizes,
                                   p->strides, err);
        }
        return rc;
    }
    uint64_t esz = ckpt_dtype_elem_size(t->dtype);
    if (t->ndim != 2 || !esz)
        return ckpt_fail(err, -EINVAL,
                         "tensor \"%.*s\": only a 2-dim tensor of whole elements can be laid out "
                         "as llama.cpp expects (it is %u-dim %s)",
                         SHOWN(t->name_len), t->name, t->ndim, ckpt_dtype_info_of(t->dtype)->name);
    if (m->transpose) {
        uint64_t shape[2] = {t->shape[1], t->shape[0]};
        rc = catalog_add_tensor(out, m->name, len, t->dtype, 2, shape, &idx, err);
        for (uint32_t k = 0; !rc && k < t->npieces; k++) {
            box b = box_of(t, &t->pieces[k]);
            uint64_t offsets[2] = {b.col, b.row}, sizes[2] = {b.cols, b.rows};
            uint64_t strides[2] = {b.scol, b.srow};
            rc = catalog_add_piece(out, idx, t->pieces[k].source, t->pieces[k].file_offset, offsets,
                                   sizes, strides, err);
        }
        return rc;
    }
    uint64_t rows = t->shape[0], heads = (uint64_t)m->permute_heads;
    if (!heads || rows % heads || (rows / heads) % 2)
        return ckpt_fail(err, -EINVAL, "tensor \"%.*s\": %llu rows are not %llu heads of pairs",
                         SHOWN(t->name_len), t->name, (unsigned long long)rows,
                         (unsigned long long)heads);
    uint64_t D = rows / heads;
    rc = catalog_add_tensor(out, m->name, len, t->dtype, 2, t->shape, &idx, err);
    /* Row x of the source (head h, half j, index i of the half) is row h*D + 2i + j of llama.cpp's
     * order: each row of each piece becomes a one-row piece there. */
    for (uint32_t k = 0; !rc && k < t->npieces; k++) {
        const ckpt_piece *p = &t->pieces[k];
        box b = box_of(t, p);
        for (uint64_t x = b.row; !rc && x < b.row + b.rows; x++) {
            uint64_t h = x / D, y = x % D, j = y / (D / 2), i = y % (D / 2);
            uint64_t offsets[2] = {h * D + 2 * i + j, b.col}, sizes[2] = {1, b.cols};
            uint64_t strides[2] = {b.srow, b.scol};
            rc = catalog_add_piece(out, idx, p->source, p->file_offset + (x - b.row) * b.srow * esz,
                                   offsets, sizes, p->strides ? strides : NULL, err);
        }
    }
    return rc;
}

/* The hyper-parameters as KV records of the gguf_kv document. */
static void put_kv(strbuf *sb, const char *key, const char *type) {
    sb_puts(sb, sb->len > 1 ? ",\n[" : "\n[");
    sb_json_str(sb, key, strlen(key));
    sb_printf(sb, ",\"%s\",", type);
}

static void kv_u32(strbuf *sb, const char *key, uint64_t v) {
    put_kv(sb, key, "u32");
    sb_printf(sb, "%llu]", (unsigned long long)v);
}

static void kv_f32(strbuf *sb, const char *key, const json_value *v, const char *dflt) {
    put_kv(sb, key, "f32");
    if (v && v->type == JSON_NUMBER)
        sb_put(sb, v->str, v->len);
    else
        sb_puts(sb, dflt);
    sb_putc(sb, ']');
}

static void kv_str(strbuf *sb, const char *key, const char *v) {
    put_kv(sb, key, "str");
    sb_json_str(sb, v, strlen(v));
    sb_putc(sb, ']');
}

/* gguf-py's model_weight_count_rounded_notation: "8.0B", "124M", "15K" (two digits at least). */
static void size_label(uint64_t params, char *out, size_t n) {
    static const struct {
        double at;
        char suffix;
    } scales[] = {{1e12, 'T'}, {1e9, 'B'}, {1e6, 'M'}, {0, 'K'}};
    size_t k = 0;
    while (scales[k].at && !((double)params > scales[k].at)) k++;
    double v = (double)params / (scales[k].at ? scales[k].at : 1e3);
    char whole[32];
    snprintf(whole, sizeof whole, "%.0f", v);
    const char *digits = whole;
    while (*digits == '0') digits++;
    int fix = 2 - (int)strlen(digits);
    snprintf(out, n, "%.*f%c", fix > 0 ? fix : 0, v, scales[k].suffix);
}

/* What llama.cpp's converter writes about any model: general.type, general.name (here the
 * folder's name), general.size_label from the parameter count, the quantization version.
 * general.file_type is the GGUF writer's (it knows the dtypes after --dtype). */
static void general_kvs(strbuf *sb, const ckpt_catalog *in, const ckpt_catalog *out) {
    kv_str(sb, "general.type", "model");
    const char *base = strrchr(in->root, '/');
    base = base && base[1] ? base + 1 : in->root;
    char name[256];
    size_t len = strlen(base);
    while (len > 1 && base[len - 1] == '/') len--;
    snprintf(name, sizeof name, "%.*s", (int)(len < 255 ? len : 255), base);
    kv_str(sb, "general.name", name);
    uint64_t params = 0;
    for (size_t i = 0; i < out->ntensors; i++) params += out->tensors[i].numel;
    char label[48];
    size_label(params, label, sizeof label);
    kv_str(sb, "general.size_label", label);
    kv_u32(sb, "general.quantization_version", 2);
}

static void hparam_kvs(strbuf *sb, const hparams *h) {
    const char *a = family_name(h->family);
    char key[96];
#define K(suffix) (snprintf(key, sizeof key, "%s.%s", a, suffix), key)
    kv_str(sb, "general.architecture", a);
    kv_u32(sb, K("context_length"), h->n_ctx);
    kv_u32(sb, K("embedding_length"), h->n_embd);
    kv_u32(sb, K("block_count"), h->n_layer);
    kv_u32(sb, K("feed_forward_length"), h->n_ff);
    kv_u32(sb, K("attention.head_count"), h->n_head);
    if (h->family != FAMILY_GPT2) {
        kv_u32(sb, K("attention.head_count_kv"), h->n_head_kv);
        kv_u32(sb, K("rope.dimension_count"), h->head_dim);
        if (h->head_dim * h->n_head != h->n_embd) {
            kv_u32(sb, K("attention.key_length"), h->head_dim);
            kv_u32(sb, K("attention.value_length"), h->head_dim);
        }
        kv_f32(sb, K("attention.layer_norm_rms_epsilon"), h->eps, "1e-6");
        kv_f32(sb, K("rope.freq_base"), h->rope_theta, "10000");
        /* linear rope scaling, as the converter writes it (llama3's rope type needs a
         * rope_freqs tensor made from the formula, which is not written) */
        const json_value *type = json_member(h->rope_scaling, "type");
        if (!type) type = json_member(h->rope_scaling, "rope_type");
        const json_value *factor = json_member(h->rope_scaling, "factor");
        if (json_str_eq(type, "linear") && factor && factor->type == JSON_NUMBER) {
            kv_str(sb, K("rope.scaling.type"), "linear");
            kv_f32(sb, K("rope.scaling.factor"), factor, "1");
        }
    } else {
        kv_f32(sb, K("attention.layer_norm_epsilon"), h->eps, "1e-5");
    }
    if (h->n_vocab) kv_u32(sb, K("vocab_size"), h->n_vocab);
#undef K
}

int ckpt_profile_llamacpp(const ckpt_catalog *in, ckpt_catalog **result, char **note,
                          ckpt_err *err) {
    *result = NULL;
    *note = NULL;
    char *text = NULL;
    json_doc cfg;
    int rc = ckpt_read_aux_json(in, "config.json", &text, &cfg, err);
    if (rc == 1) return 0; /* no config.json: a tensor container */
    if (rc) return rc;
    hparams h;
    rc = read_hparams(cfg.root, &h, in->root, err);
    if (rc || h.family == FAMILY_NONE) {
        json_doc_free(&cfg);
        free(text);
        return rc;
    }
    ckpt_catalog *out = catalog_new(in->root, in->format);
    strbuf kv;
    sb_init(&kv);
    sb_putc(&kv, '[');
    if (!out) rc = ckpt_fail(err, -ENOMEM, "out of memory");
    for (uint32_t i = 0; !rc && i < in->nsources; i++) { /* same order: piece sources carry */
        uint32_t idx;
        const ckpt_source *s = &in->sources[i];
        rc = s->member_of ? ckpt_fail(err, -EINVAL,
                                      "%s: a model inside an archive cannot be laid out for "
                                      "llama.cpp (convert it to a file first)",
                                      in->root)
                          : catalog_add_source(out, s->path, s->relpath, &idx, err);
    }
    /* A catalog that shows its model to the HF view as other tensors (a Meta checkpoint as
     * the Llama checkpoint transformers' script writes) is laid out from those: the HF names
     * and rows are what the mapping below knows. */
    bool renamed = false;
    for (size_t i = 0; i < in->ntensors && !renamed; i++) renamed = in->tensors[i].hf_view;
    for (size_t i = 0; !rc && i < in->ntensors; i++) {
        const ckpt_tensor *t = &in->tensors[i];
        if (renamed ? !t->hf_view : t->aside) continue;
        mapped m;
        bool known = h.family != FAMILY_GPT2 ? map_llama(t->name, t->name_len, &h, &m)
                                             : map_gpt2(t->name, t->name_len, &m);
        if (!known)
            rc = ckpt_fail(err, -EINVAL,
                           "tensor \"%.*s\" has no llama.cpp name in the %s layout (convert with "
                           "--exclude to leave it out)",
                           SHOWN(t->name_len), t->name, family_name(h.family));
        else if (!m.skip)
            rc = add_mapped(out, t, &m, err);
    }
    if (!rc) {
        hparam_kvs(&kv, &h);
        general_kvs(&kv, in, out);
        static const char *const pre[] = {
            [FAMILY_LLAMA] = "default", [FAMILY_QWEN2] = "qwen2", [FAMILY_GPT2] = "gpt-2"};
        rc = ckpt_gguf_vocab_kvs(in, pre[h.family], h.n_vocab, cfg.root, &kv, note, err);
    }
    sb_puts(&kv, "\n]");
    if (!rc && kv.failed) rc = ckpt_fail(err, -ENOMEM, "out of memory");
    if (!rc) rc = catalog_add_doc(out, "gguf_kv", kv.data, kv.len, err);
    if (!rc) rc = catalog_finish(out, err);
    sb_free(&kv);
    json_doc_free(&cfg);
    free(text);
    if (rc) {
        ckpt_close(out);
        free(*note);
        *note = NULL;
        return rc;
    }
    *result = out;
    return 0;
}
