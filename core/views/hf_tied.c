/* The tied lm_head that save_pretrained leaves out. A torch checkpoint of a model whose config
 * ties the output projection to the input embedding (tie_word_embeddings) stores one storage
 * under both names; transformers' save_pretrained writes it once, under the embedding's name,
 * and from_pretrained ties lm_head to it again. The HF view does the same, so its safetensors
 * do not hold a second full copy of the embedding. Only a true alias is left out (the very
 * bytes of another tensor, and a config.json that says "tie_word_embeddings": true): a head
 * stored apart, or a config that does not say so, keeps it. */
#include "hf_tied.h"

#include "../model/catalog.h"
#include "../util/json.h"

#include <stdlib.h>
#include <string.h>

enum { CONFIG_MAX = 1 << 20 }; /* config.json files are a few KiB */

static bool config_ties(const ckpt_catalog *cat) {
    const char *text = cat->hf_config;
    size_t len = text ? strlen(text) : 0;
    char *owned = NULL;
    for (size_t i = 0; !text && i < cat->naux; i++) {
        const ckpt_aux_file *a = &cat->aux[i];
        if (strcmp(a->name, "config.json") != 0 || a->source >= cat->nsources) continue;
        uint64_t size = cat->sources[a->source].size;
        ckpt_err err;
        if (size == 0 || size > CONFIG_MAX || !(owned = malloc(size))) break;
        if (ckpt_source_read(cat, a->source, 0, owned, size, "config.json", &err) != 0) break;
        text = owned;
        len = size;
    }
    bool ties = false;
    json_doc doc;
    json_error jerr;
    if (text && json_parse(&doc, text, len, &jerr) == 0) {
        const json_value *v = json_member(doc.root, "tie_word_embeddings");
        ties = v && v->type == JSON_TRUE;
        json_doc_free(&doc);
    }
    free(owned);
    return ties;
}

static bool same_extent(const ckpt_tensor *a, const ckpt_tensor *b) {
    return a->npieces == 1 && b->npieces == 1 && a->nbytes == b->nbytes &&
           a->pieces[0].source == b->pieces[0].source &&
           a->pieces[0].file_offset == b->pieces[0].file_offset;
}

size_t ckpt_hf_tied_head(const ckpt_catalog *cat) {
    size_t head = SIZE_MAX;
    for (size_t i = 0; i < cat->ntensors && head == SIZE_MAX; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        if (!t->aside && !t->prefix && t->npieces == 1 && t->nbytes && t->name_len == 14 &&
            memcmp(t->name, "lm_head.weight", 14) == 0)
            head = i;
    }
    if (head == SIZE_MAX) return SIZE_MAX;
    bool alias = false;
    for (size_t i = 0; i < cat->ntensors && !alias; i++)
        alias = i != head && !cat->tensors[i].aside &&
                same_extent(&cat->tensors[i], &cat->tensors[head]);
    return alias && config_ties(cat) ? head : SIZE_MAX;
}
