/* The tokenizer of a Hugging Face folder as GGUF key-values, for llama.cpp: a BPE
 * tokenizer.json (model.type "BPE") gives tokenizer.ggml.model "gpt2", the tokens by id, their
 * types (1 normal, 3 control for special added tokens, 4 user-defined for other added tokens,
 * 5 unused for ids nothing names, shown as "[PADn]"), the merges as "a b", and the bos/eos ids
 * of config.json. Without a BPE tokenizer.json the model is written with tokenizer.ggml.model
 * "no_vocab" and a note says so. */
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

static void no_vocab(strbuf *kv, char **note, const char *why) {
    kv_head(kv, "tokenizer.ggml.model", "str");
    sb_puts(kv, "\"no_vocab\"]");
    size_t n = strlen(why) + 96;
    if ((*note = malloc(n)))
        snprintf(*note, n,
                 "%s: the GGUF has no vocabulary (llama.cpp loads it; text in and out "
                 "needs token ids)",
                 why);
}

typedef struct token {
    const char *s;
    size_t len;
    int type;
} token;

static bool id_of(const json_value *v, uint64_t limit, uint64_t *id) {
    return v && json_as_u64(v, id) && *id < limit;
}

int ckpt_gguf_vocab_kvs(const ckpt_catalog *in, const char *pre, uint64_t n_vocab,
                        const json_value *bos, const json_value *eos, strbuf *kv, char **note,
                        ckpt_err *err) {
    char *text = NULL;
    json_doc doc;
    int rc = ckpt_read_aux_json(in, "tokenizer.json", &text, &doc, err);
    if (rc == 1) {
        no_vocab(kv, note, "no tokenizer.json beside the weights");
        return 0;
    }
    if (rc) return rc;
    const json_value *model = json_member(doc.root, "model");
    const json_value *vocab = json_member(model, "vocab"), *merges = json_member(model, "merges");
    if (!json_str_eq(json_member(model, "type"), "BPE") || !vocab || vocab->type != JSON_OBJECT) {
        no_vocab(kv, note, "tokenizer.json is not a BPE tokenizer");
        json_doc_free(&doc);
        free(text);
        return 0;
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
    if (id_of(bos, n, &id)) {
        kv_head(kv, "tokenizer.ggml.bos_token_id", "u32");
        sb_printf(kv, "%llu]", (unsigned long long)id);
    }
    if (id_of(eos, n, &id)) {
        kv_head(kv, "tokenizer.ggml.eos_token_id", "u32");
        sb_printf(kv, "%llu]", (unsigned long long)id);
    }
out:
    json_doc_free(&doc);
    free(text);
    return rc;
}
