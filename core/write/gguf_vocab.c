/* The tokenizer of a Hugging Face folder as GGUF key-values, for llama.cpp: a BPE
 * tokenizer.json (model.type "BPE") gives tokenizer.ggml.model "gpt2", the tokens by id, their
 * types (1 normal, 3 control for special added tokens, 4 user-defined for other added tokens,
 * 5 unused for ids nothing names, shown as "[PADn]"), the merges as "a b", and what gguf-py's
 * SpecialVocab (the part of llama.cpp's convert_hf_to_gguf.py that reads these files) takes:
 * the special token ids (bos, eos, unk, sep, pad, cls, mask) from tokenizer_config.json's
 * *_token contents looked up in added_tokens, else config.json's *_token_id; add_bos_token /
 * add_eos_token from tokenizer_config.json, else from tokenizer.json's TemplateProcessing
 * post-processor (a leading bos, a trailing eos); chat_template. Without a BPE tokenizer.json
 * the folder is refused: llama.cpp aborts on a GGUF without a vocabulary. */
#include "profile.h"

#include "../util/json.h"
#include "../util/strbuf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TYPE_NORMAL = 1, TYPE_CONTROL = 3, TYPE_USER = 4, TYPE_UNUSED = 5, MAX_VOCAB = 1 << 22 };

static void kv_head(strbuf *sb, const char *key, const char *type) {
    sb_puts(sb, ",\n[");
    sb_json_str(sb, key, strlen(key));
    sb_printf(sb, ",\"%s\",", type);
}

static int no_vocab(const ckpt_catalog *in, const char *why, ckpt_err *err) {
    return ckpt_fail(err, -EINVAL,
                     "%s: %s: llama.cpp cannot load a GGUF without a vocabulary (add the "
                     "model's tokenizer.json, or write a tensor container with --profile "
                     "container)",
                     in->root, why);
}

typedef struct token {
    const char *s;
    size_t len;
    int type;
} token;

static bool id_of(const json_value *v, uint64_t limit, uint64_t *id) {
    return v && json_as_u64(v, id) && *id < limit;
}

/* The content a tokenizer_config.json member names: "<s>" or {"content": "<s>", ...}. */
static const json_value *token_content(const json_value *entry) {
    if (entry && entry->type == JSON_STRING) return entry;
    const json_value *c =
        entry && entry->type == JSON_OBJECT ? json_member(entry, "content") : NULL;
    return c && c->type == JSON_STRING ? c : NULL;
}

static bool same_str(const json_value *a, const json_value *b) {
    return a && b && a->type == JSON_STRING && b->type == JSON_STRING && a->len == b->len &&
           memcmp(a->str, b->str, a->len) == 0;
}

/* The id of the first added token whose content is c (SpecialVocab looks only there). */
static bool added_id(const json_value *added, const json_value *c, uint64_t n, uint64_t *id) {
    for (const json_value *a = added ? added->head : NULL; c && a; a = a->next)
        if (same_str(json_member(a, "content"), c)) return id_of(json_member(a, "id"), n, id);
    return false;
}

static const char *const SPECIAL[] = {"bos", "eos", "unk", "sep", "pad", "cls", "mask"};
enum { NSPECIAL = sizeof SPECIAL / sizeof *SPECIAL, S_BOS = 0, S_EOS = 1, S_SEP = 3, S_CLS = 5 };
/* gguf-py's key names (sic: "seperator") */
static const char *const SPECIAL_KEY[] = {
    "bos_token_id",     "eos_token_id", "unknown_token_id", "seperator_token_id",
    "padding_token_id", "cls_token_id", "mask_token_id"};

static const json_value *special_id(const json_value *item) {
    const json_value *id = json_member(json_member(item, "SpecialToken"), "id");
    return id && id->type == JSON_STRING && id->len ? id : NULL;
}

static bool sequence_is(const json_value *item, const char *which) {
    return json_str_eq(json_member(json_member(item, "Sequence"), "id"), which);
}

/* add_sep_token from the pair template "[first] A [sep] [sep] B [last]", SpecialVocab's way:
 * set when A and B frame a middle, true if that middle holds a sep or eos token. */
static void pair_sep(const json_value *pair, const json_value *first, const json_value *last,
                     const json_value *sep, const json_value *eos, int add[]) {
    if (!pair || pair->type != JSON_ARRAY || !pair->count) return;
    const json_value *items[64];
    size_t n = 0;
    for (const json_value *e = pair->head; e && n < 64; e = e->next) items[n++] = e;
    size_t lo = first && same_str(special_id(items[0]), first) ? 1 : 0, hi = n;
    if (last && hi > lo && same_str(special_id(items[hi - 1]), last)) hi--;
    if (hi - lo < 3 || !sequence_is(items[lo], "A") || !sequence_is(items[hi - 1], "B")) return;
    bool add_sep = false;
    const json_value *m0 = special_id(items[lo + 1]);
    if (m0 && (same_str(m0, sep) || same_str(m0, eos)) && !last) add_sep = true;
    if (hi - lo == 4) {
        const json_value *m1 = special_id(items[lo + 2]);
        if (m1 && (same_str(m1, sep) || same_str(m1, eos))) add_sep = true;
    }
    add[S_SEP] = add_sep;
}

/* -1 unset, 0 false, 1 true */
static void template_adds(const json_value *tok, const json_value *bos, const json_value *cls,
                          const json_value *eos, const json_value *sep, int add[NSPECIAL]) {
    const json_value *pp = json_member(tok, "post_processor");
    if (!pp || pp->type != JSON_OBJECT) return;
    const json_value *list = json_member(pp, "processors");
    const json_value *one = list && list->type == JSON_ARRAY ? list->head : pp;
    for (; one; one = list && list->type == JSON_ARRAY ? one->next : NULL) {
        const json_value *type = json_member(one, "type");
        if (json_str_eq(type, "RobertaProcessing")) {
            add[S_BOS] = add[S_EOS] = add[S_SEP] = 1;
        } else if (json_str_eq(type, "TemplateProcessing")) {
            const json_value *single = json_member(one, "single");
            if (!single || single->type != JSON_ARRAY || single->count < 2) continue;
            const json_value *last = single->head;
            while (last->next) last = last->next;
            const json_value *first_id =
                json_member(json_member(single->head, "SpecialToken"), "id");
            const json_value *last_id = json_member(json_member(last, "SpecialToken"), "id");
            bool lead = first_id && first_id->type == JSON_STRING && first_id->len;
            bool trail = last_id && last_id->type == JSON_STRING && last_id->len;
            if (lead) add[S_BOS] = !bos || same_str(first_id, bos) || same_str(first_id, cls);
            if (trail) add[S_EOS] = !eos || same_str(last_id, eos);
            pair_sep(json_member(one, "pair"), lead ? first_id : NULL, trail ? last_id : NULL, sep,
                     eos, add);
        }
    }
}

static int special_kvs(const ckpt_catalog *in, const json_value *tok, const json_value *cfg,
                       uint64_t n, strbuf *kv, ckpt_err *err) {
    char *text = NULL;
    json_doc tc = {0};
    int rc = ckpt_read_aux_json(in, "tokenizer_config.json", &text, &tc, err);
    if (rc < 0) return rc;
    const json_value *conf = rc == 0 && tc.root->type == JSON_OBJECT ? tc.root : NULL;
    rc = 0;
    const json_value *added = json_member(tok, "added_tokens");
    const json_value *bos = token_content(json_member(conf, "bos_token"));
    const json_value *eos = token_content(json_member(conf, "eos_token"));
    const json_value *cls = token_content(json_member(conf, "cls_token"));
    const json_value *sep = token_content(json_member(conf, "sep_token"));
    if (!bos) bos = cls; /* SpecialVocab: a cls token stands in for a missing bos, sep for eos */
    if (!eos) eos = sep;
    int add[NSPECIAL];
    for (int i = 0; i < NSPECIAL; i++) add[i] = -1;
    template_adds(tok, bos, cls, eos, sep, add);
    bool have[NSPECIAL] = {0};
    uint64_t ids[NSPECIAL] = {0};
    char key[64];
    for (int i = 0; i < NSPECIAL; i++) {
        snprintf(key, sizeof key, "add_%s_token", SPECIAL[i]);
        const json_value *a = json_member(conf, key);
        if (a && (a->type == JSON_TRUE || a->type == JSON_FALSE)) add[i] = a->type == JSON_TRUE;
        snprintf(key, sizeof key, "%s_token", SPECIAL[i]);
        const json_value *c = i == S_BOS   ? bos
                              : i == S_EOS ? eos
                                           : token_content(json_member(conf, key));
        have[i] = added_id(added, c, n, &ids[i]);
    }
    for (int i = 0; i < NSPECIAL; i++) { /* config.json's ids for what is still unset */
        snprintf(key, sizeof key, "%s_token_id", SPECIAL[i]);
        if (!have[i]) have[i] = id_of(json_member(cfg, key), n, &ids[i]);
    }
    for (int i = 0; i < NSPECIAL; i++)
        if (have[i]) {
            snprintf(key, sizeof key, "tokenizer.ggml.%s", SPECIAL_KEY[i]);
            kv_head(kv, key, "u32");
            sb_printf(kv, "%llu]", (unsigned long long)ids[i]);
        }
    for (int i = 0; i < NSPECIAL; i++)
        if (add[i] >= 0 && (i == S_BOS || i == S_EOS || i == S_SEP)) {
            snprintf(key, sizeof key, "tokenizer.ggml.add_%s_token", SPECIAL[i]);
            kv_head(kv, key, "bool");
            sb_puts(kv, add[i] ? "true]" : "false]");
        }
    const json_value *tmpl = json_member(conf, "chat_template");
    if (tmpl && tmpl->type == JSON_STRING) {
        kv_head(kv, "tokenizer.chat_template", "str");
        sb_json_str(kv, tmpl->str, tmpl->len);
        sb_putc(kv, ']');
    }
    if (conf || text) json_doc_free(&tc);
    free(text);
    return rc;
}

int ckpt_gguf_vocab_kvs(const ckpt_catalog *in, const char *pre, uint64_t n_vocab,
                        const json_value *cfg, strbuf *kv, char **note, ckpt_err *err) {
    (void)note;
    char *text = NULL;
    json_doc doc;
    int rc = ckpt_read_aux_json(in, "tokenizer.json", &text, &doc, err);
    if (rc == 1) return no_vocab(in, "no tokenizer.json beside the weights", err);
    if (rc) return rc;
    const json_value *model = json_member(doc.root, "model");
    const json_value *vocab = json_member(model, "vocab"), *merges = json_member(model, "merges");
    if (!json_str_eq(json_member(model, "type"), "BPE") || !vocab || vocab->type != JSON_OBJECT) {
        json_doc_free(&doc);
        free(text);
        return no_vocab(in, "tokenizer.json is not a BPE tokenizer (model.type)", err);
    }
    /* how many ids: the largest named, or config.json's vocab_size (the embedding's rows) */
    uint64_t n = n_vocab, id;
    const json_value *added = json_member(doc.root, "added_tokens");
    for (const json_value *v = vocab->head; v; v = v->next)
        if (json_as_u64(v, &id) && id < MAX_VOCAB && id + 1 > n) n = id + 1;
    for (const json_value *a = added ? added->head : NULL; a; a = a->next)
        if (id_of(json_member(a, "id"), MAX_VOCAB, &id) && id + 1 > n) n = id + 1;
    if (n_vocab && n > n_vocab) {
        rc = ckpt_fail(err, -EINVAL,
                       "%s/tokenizer.json names token ids up to %llu, beyond config.json's "
                       "vocab_size %llu",
                       in->root, (unsigned long long)n - 1, (unsigned long long)n_vocab);
        goto out;
    }
    token *tok = calloc(n ? n : 1, sizeof *tok);
    if (!tok) {
        rc = ckpt_fail(err, -ENOMEM, "out of memory");
        goto out;
    }
    for (const json_value *v = vocab->head; v; v = v->next)
        if (id_of(v, n, &id)) tok[id] = (token){v->key, v->key_len, TYPE_NORMAL};
    for (const json_value *a = added ? added->head : NULL; a; a = a->next) {
        const json_value *c = json_member(a, "content");
        if (!id_of(json_member(a, "id"), n, &id) || !c || c->type != JSON_STRING) continue;
        bool special = json_member(a, "special") && json_member(a, "special")->type == JSON_TRUE;
        tok[id] = (token){c->str, c->len, special ? TYPE_CONTROL : TYPE_USER};
    }
    kv_head(kv, "tokenizer.ggml.model", "str");
    sb_puts(kv, "\"gpt2\"]");
    kv_head(kv, "tokenizer.ggml.pre", "str");
    sb_json_str(kv, pre, strlen(pre));
    sb_putc(kv, ']');
    kv_head(kv, "tokenizer.ggml.tokens", "arr_str");
    sb_putc(kv, '[');
    for (uint64_t i = 0; i < n; i++) {
        if (i) sb_putc(kv, ',');
        if (tok[i].s) {
            sb_json_str(kv, tok[i].s, tok[i].len);
        } else {
            char pad[32];
            int w = snprintf(pad, sizeof pad, "[PAD%llu]", (unsigned long long)i);
            sb_json_str(kv, pad, (size_t)w);
        }
    }
    sb_puts(kv, "]]");
    kv_head(kv, "tokenizer.ggml.token_type", "arr_i32");
    sb_putc(kv, '[');
    for (uint64_t i = 0; i < n; i++)
        sb_printf(kv, "%s%d", i ? "," : "", tok[i].s ? tok[i].type : TYPE_UNUSED);
    sb_puts(kv, "]]");
    free(tok);
    kv_head(kv, "tokenizer.ggml.merges", "arr_str");
    sb_putc(kv, '[');
    bool first = true;
    for (const json_value *m = merges ? merges->head : NULL; m; m = m->next) {
        if (m->type == JSON_STRING) {
            sb_puts(kv, first ? "" : ",");
            sb_json_str(kv, m->str, m->len);
        } else if (m->type == JSON_ARRAY && m->count == 2 && m->head->type == JSON_STRING &&
                   m->head->next->type == JSON_STRING) {
            /* newer tokenizers: ["a", "b"] */
            strbuf pair;
            sb_init(&pair);
            sb_put(&pair, m->head->str, m->head->len);
            sb_putc(&pair, ' ');
            sb_put(&pair, m->head->next->str, m->head->next->len);
            sb_puts(kv, first ? "" : ",");
            sb_json_str(kv, pair.data ? pair.data : "", pair.len);
            sb_free(&pair);
        } else {
            continue;
        }
        first = false;
    }
    sb_puts(kv, "]]");
    rc = special_kvs(in, doc.root, cfg, n, kv, err);
out:
    json_doc_free(&doc);
    free(text);
    return rc;
}
