/* Directory helpers shared by the directory formats: the sorted model files of a directory,
 * and the names of the files a Hugging Face model keeps beside its weights. */
#include "../io/place.h"
#include "formats.h"

#include "../util/text.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

const char *const ckpt_hf_aux_names[] = {
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "added_tokens.json",
    "chat_template.json",
    "chat_template.jinja",
    "preprocessor_config.json",
    "spiece.model",
    "adapter_config.json",
};
const size_t ckpt_hf_aux_count = sizeof ckpt_hf_aux_names / sizeof *ckpt_hf_aux_names;

static int name_cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int dirlist_names(const char *dir, bool (*keep)(const struct place_entry *e, void *ctx), void *ctx,
                  char ***out, size_t *count) {
    *out = NULL;
    *count = 0;
    place_entry *e;
    size_t ne;
    int rc = place_list(dir, &e, &ne);
    if (rc) return rc;
    char **names = ne ? malloc(ne * sizeof *names) : NULL;
    size_t n = 0;
    if (ne && !names) rc = -ENOMEM;
    for (size_t i = 0; i < ne && !rc; i++) {
        if (keep && !keep(&e[i], ctx)) continue;
        names[n++] = e[i].name;
        e[i].name = NULL;
    }
    place_list_free(e, ne);
    if (rc) {
        dirlist_free(names, n);
        return rc;
    }
    if (n > 1) qsort(names, n, sizeof *names, name_cmp);
    *out = names;
    *count = n;
    return 0;
}

/* A file (local or remote) whose name ends in the suffix ctx. */
static bool is_file_with_suffix(const struct place_entry *e, void *ctx) {
    return e->kind == PLACE_FILE && text_ends_with(e->name, ctx);
}

int dirlist_files(const char *dir, const char *suffix, char ***out, size_t *count) {
    return dirlist_names(dir, is_file_with_suffix, (void *)suffix, out, count);
}

void dirlist_free(char **names, size_t n) {
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
}
