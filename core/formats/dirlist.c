/* Directory helpers shared by the directory formats: the sorted model files of a directory,
 * and the names of the files a Hugging Face model keeps beside its weights. */
#include "../io/place.h"
#include "formats.h"
#include "../model/st_names.h"

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

bool ckpt_hf_aux_name(const char *name) {
    for (size_t i = 0; i < ckpt_hf_aux_count; i++)
        if (strcmp(name, ckpt_hf_aux_names[i]) == 0) return true;
    if (!name[0] || name[0] == '.' || strchr(name, '/')) return false;
    /* Weights and what indexes them are the model, never carried as a side file. */
    static const char *const weights[] = {
        ".safetensors", ".bin",     ".pt",     ".pth",        ".ckpt",    ".gguf",
        ".h5",          ".msgpack", ".onnx",   ".npy",        ".npz",     ".zst",
        ".tar",         ".nemo",    ".distcp", ".index.json", ".metadata"};
    for (size_t i = 0; i < sizeof weights / sizeof *weights; i++)
        if (text_ends_with(name, weights[i])) return false;
    static const char *const side[] = {".json", ".model", ".tiktoken", ".txt", ".md",
                                       ".yaml", ".yml",   ".jinja",    ".py",  ".vocab"};
    for (size_t i = 0; i < sizeof side / sizeof *side; i++)
        if (text_ends_with(name, side[i])) return true;
    static const char *const docs[] = {"LICENSE", "README", "NOTICE", "USE_POLICY", "COPYING"};
    for (size_t i = 0; i < sizeof docs / sizeof *docs; i++)
        if (strncmp(name, docs[i], strlen(docs[i])) == 0) return true;
    return false;
}

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
