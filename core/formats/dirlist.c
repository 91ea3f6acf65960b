/* Directory helpers shared by the directory formats: the sorted model files of a directory,
 * and the names of the files a Hugging Face model keeps beside its weights. */
#include "formats.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

const char *const hf_aux_names[] = {
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
const size_t hf_aux_count = sizeof hf_aux_names / sizeof *hf_aux_names;

static int name_cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int list_files(const char *dir, const char *suffix, char ***out, size_t *count) {
    *out = NULL;
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) return -errno;
    char **names = NULL;
    size_t n = 0, cap = 0, sl = strlen(suffix);
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        char path[PATH_MAX];
        struct stat st;
        if (len < sl || strcmp(e->d_name + len - sl, suffix) != 0) continue;
        int w = snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (w < 0 || w >= (int)sizeof path || stat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            char **p = realloc(names, cap * sizeof *p);
            if (!p) {
                rc = -ENOMEM;
                break;
            }
            names = p;
        }
        if (!(names[n] = strdup(e->d_name))) {
            rc = -ENOMEM;
            break;
        }
        n++;
    }
    closedir(d);
    if (rc) {
        free_files(names, n);
        return rc;
    }
    if (n > 1) qsort(names, n, sizeof *names, name_cmp);
    *out = names;
    *count = n;
    return 0;
}

void free_files(char **names, size_t n) {
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
}
