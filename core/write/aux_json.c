/* A catalog's aux file (config.json, tokenizer.json) read whole and parsed: what the profiles
 * and the GGUF vocabulary take from a Hugging Face folder. */
#include "profile.h"

#include "../util/json.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int ckpt_read_aux_json(const ckpt_catalog *cat, const char *name, char **text, json_doc *doc,
                       ckpt_err *err) {
    *text = NULL;
    const ckpt_aux_file *a = NULL;
    for (size_t i = 0; i < cat->naux; i++)
        if (strcmp(cat->aux[i].name, name) == 0) a = &cat->aux[i];
    if (!a && strcmp(name, "config.json") == 0 && cat->hf_config) {
        /* no file, but the one the HF view synthesizes (a Meta checkpoint's, from params.json) */
        size_t len = strlen(cat->hf_config);
        char *copy = malloc(len + 1);
        if (!copy) return ckpt_fail(err, -ENOMEM, "out of memory");
        memcpy(copy, cat->hf_config, len + 1);
        json_error jerr;
        if (json_parse(doc, copy, len, &jerr) != 0) {
            free(copy);
            return ckpt_fail(err, -EINVAL,
                             "%s: the config.json made from params.json: byte %zu: %s", cat->root,
                             jerr.pos, jerr.msg);
        }
        *text = copy;
        return 0;
    }
    if (!a) return 1;
    const ckpt_source *s = &cat->sources[a->source];
    if (s->size > (256u << 20)) return ckpt_fail(err, -EFBIG, "%s: too large", s->path);
    char *buf = malloc(s->size ? s->size : 1);
    if (!buf) return ckpt_fail(err, -ENOMEM, "out of memory");
    uint64_t got = 0;
    while (got < s->size) {
        ssize_t r = ckpt_source_pread(s, buf + got, (size_t)(s->size - got), got);
        if (r <= 0) {
            free(buf);
            return ckpt_fail(err, -EIO, "%s: cannot read it", s->path);
        }
        got += (uint64_t)r;
    }
    json_error jerr;
    if (json_parse(doc, buf, (size_t)s->size, &jerr) != 0) {
        free(buf);
        return ckpt_fail(err, -EINVAL, "%s: byte %zu: %s", s->path, jerr.pos, jerr.msg);
    }
    *text = buf;
    return 0;
}
