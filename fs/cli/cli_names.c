/* Tensor names on the command line: how they are printed one per line, and how a name typed
 * by the user (exact, qualified, tree path, or the printed form) finds its tensor.
 *
 * A catalog may show tensors under a directory (t->prefix: "optim/", ".ckptfs/ranks/0/"), and
 * names are unique only within one prefix, so a line names a tensor as prefix + name: the
 * "qualified" name, e.g. "optim/state.lm_head.weight.exp_avg". */
#include "cli_internal.h"

#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>

void cli_put_display_name(strbuf *sb, const ckpt_tensor *t) {
    if (t->prefix) text_pct_escape(sb, t->prefix, strlen(t->prefix), false);
    text_pct_escape(sb, t->name, t->name_len, false);
}

bool cli_hidden(const ckpt_tensor *t) {
    return t->prefix && t->prefix[0] == '.';
}

int cli_glob_match(const char *glob, const ckpt_tensor *t, strbuf *name) {
    sb_clear(name);
    if (t->prefix) text_pct_escape(name, t->prefix, strlen(t->prefix), false);
    size_t bare = name->len; /* where the name starts */
    text_pct_escape(name, t->name, t->name_len, false);
    sb_putc(name, '\0');
    size_t tree = name->len; /* the tree path, which starts with the prefix */
    if (t->prefix && strncmp(t->path, t->prefix, strlen(t->prefix)) != 0) sb_puts(name, t->prefix);
    sb_puts(name, t->path);
    if (name->failed || !name->data) return CLI_GLOB_NO;
    const char *s = name->data, *path = s + tree;
    if (fnmatch(glob, s + bare, 0) == 0) return CLI_GLOB_NAME;
    /* the unescaped name, as --include always took it */
    char *raw = strndup(t->name, t->name_len);
    bool raw_hit = raw && fnmatch(glob, raw, 0) == 0;
    free(raw);
    if (raw_hit) return CLI_GLOB_NAME;
    int via = t->prefix ? CLI_GLOB_PREFIXED : CLI_GLOB_NAME;
    if (bare && fnmatch(glob, s, 0) == 0) return via;
    size_t plen = strlen(path);
    if (fnmatch(glob, path, FNM_PATHNAME) == 0 || fnmatch(glob, path, 0) == 0) return via;
    if (plen > 4 && strcmp(path + plen - 4, ".raw") == 0) {
        name->data[tree + plen - 4] = '\0';
        if (fnmatch(glob, path, 0) == 0) return via;
    }
    return CLI_GLOB_NO;
}

/* Preference among tensors of one name: the unprefixed one, then one in the model, then the
 * first (per-rank copies and optimizer state are reached by their qualified names). */
static int rank(const ckpt_tensor *t) {
    return t->prefix ? (t->aside ? 2 : 1) : 0;
}

static const ckpt_tensor *by_name(const ckpt_catalog *cat, const char *name, size_t len) {
    const ckpt_tensor *best = NULL;
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        if (t->name_len != len || memcmp(t->name, name, len) != 0) continue;
        if (!best || rank(t) < rank(best)) best = t;
    }
    return best;
}

static const ckpt_tensor *by_qualified_name(const ckpt_catalog *cat, const char *s, size_t len) {
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        if (!t->prefix) continue;
        size_t plen = strlen(t->prefix);
        if (plen + t->name_len == len && memcmp(s, t->prefix, plen) == 0 &&
            memcmp(s + plen, t->name, t->name_len) == 0)
            return t;
    }
    return NULL;
}

static const ckpt_tensor *by_path(const ckpt_catalog *cat, const char *name) {
    /* With or without a leading '/' or the ".raw" of a tensor that is also a directory. */
    const char *path = name[0] == '/' ? name + 1 : name;
    size_t plen = strlen(path);
    for (size_t i = 0; i < cat->ntensors; i++) {
        const char *p = cat->tensors[i].path;
        size_t n = strlen(p);
        if ((n == plen && memcmp(p, path, n) == 0) ||
            (n == plen + 4 && memcmp(p, path, plen) == 0 && strcmp(p + plen, ".raw") == 0))
            return &cat->tensors[i];
    }
    return NULL;
}

const ckpt_tensor *cli_find_tensor(const ckpt_catalog *cat, const char *name) {
    size_t len = strlen(name);
    const ckpt_tensor *t = by_name(cat, name, len);
    if (!t) t = by_qualified_name(cat, name, len);
    if (!t) t = by_path(cat, name);
    if (t || !strchr(name, '%')) return t;

    char *buf = strdup(name);
    size_t ulen;
    if (buf && text_pct_unescape(buf, &ulen, true)) {
        t = by_name(cat, buf, ulen);
        if (!t) t = by_qualified_name(cat, buf, ulen);
    }
    free(buf);
    return t;
}
