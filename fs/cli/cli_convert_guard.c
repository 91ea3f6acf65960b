/* What convert checks before it writes anything: OUT is not one of its own sources nor inside
 * the source directory, an existing OUT is replaced only when asked, and the --include /
 * --exclude patterns pick the tensors. */
#include "cli_convert.h"
#include "cli_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* OUT as an absolute path with its directory resolved (OUT itself may not exist yet). */
static bool resolve_out(const char *out, char *resolved) {
    char copy[PATH_MAX], base_copy[PATH_MAX], dir[PATH_MAX];
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/') n--;
    if (n >= sizeof copy) return false;
    memcpy(copy, out, n);
    copy[n] = '\0';
    memcpy(base_copy, copy, n + 1);
    if (!realpath(dirname(copy), dir)) return false;
    const char *base = basename(base_copy);
    if (strcmp(base, ".") == 0 || strcmp(base, "..") == 0) return realpath(out, resolved) != NULL;
    return snprintf(resolved, PATH_MAX, "%s/%s", strcmp(dir, "/") ? dir : "", base) < PATH_MAX;
}

static bool inside(const char *path, const char *dir) {
    size_t n = strlen(dir);
    return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

static bool nonempty_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) return true; /* unreadable: treat as holding something */
    const struct dirent *e;
    bool any = false;
    while (!any && (e = readdir(d)))
        any = strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return any;
}

int convert_guard_out(const char *cmd, const char *source, const char *out, bool force,
                      bool *replace_dir) {
    char out_real[PATH_MAX], src_real[PATH_MAX];
    struct stat out_st, src_st;
    *replace_dir = false;
    bool out_exists = lstat(out, &out_st) == 0;
    if (!resolve_out(out, out_real)) {
        cli_error(cmd, "%s: its directory does not exist", out);
        return CLI_USAGE;
    }
    if (stat(source, &src_st) == 0 && realpath(source, src_real)) {
        if (S_ISDIR(src_st.st_mode) && inside(out_real, src_real)) {
            cli_error(cmd, "%s is inside the source directory %s: write it elsewhere", out, source);
            return CLI_USAGE;
        }
        if (out_exists && stat(out, &out_st) == 0 && out_st.st_dev == src_st.st_dev &&
            out_st.st_ino == src_st.st_ino) {
            cli_error(cmd, "%s is the source itself: write it elsewhere", out);
            return CLI_USAGE;
        }
    }
    if (!out_exists) return CLI_OK;
    bool is_dir = stat(out, &out_st) == 0 && S_ISDIR(out_st.st_mode);
    if (is_dir && !nonempty_dir(out)) return CLI_OK; /* nothing in it to overwrite */
    if (!force) {
        cli_error(cmd, "%s exists: --force replaces it%s", out,
                  is_dir ? " (files the conversion does not write are kept)" : "");
        return CLI_USAGE;
    }
    *replace_dir = is_dir;
    return CLI_OK;
}

int convert_guard_sources(const char *cmd, const ckpt_catalog *cat, const char *out) {
    char out_real[PATH_MAX], src_real[PATH_MAX];
    struct stat out_st;
    bool out_exists = stat(out, &out_st) == 0;
    bool resolved = resolve_out(out, out_real);
    for (uint32_t i = 0; i < cat->nsources; i++) {
        const ckpt_source *s = &cat->sources[i];
        if (out_exists && s->dev == out_st.st_dev && s->ino == out_st.st_ino) {
            cli_error(cmd, "%s is %s, a file of the source: write it elsewhere", out, s->path);
            return CLI_USAGE;
        }
        /* replacing a directory OUT removes the HF files it held: never a source's */
        if (resolved && out_exists && S_ISDIR(out_st.st_mode) && realpath(s->path, src_real) &&
            inside(src_real, out_real)) {
            cli_error(cmd, "%s holds %s, a file of the source: write it elsewhere", out, s->path);
            return CLI_USAGE;
        }
        /* a shard of an HF cache folder is reached through a symlink: its real place counts */
        if (resolved && realpath(s->path, src_real) && strcmp(src_real, out_real) == 0) {
            cli_error(cmd, "%s is %s, a file of the source: write it elsewhere", out, s->path);
            return CLI_USAGE;
        }
    }
    return CLI_OK;
}

/* The best way any of globs names t (CLI_GLOB_*). */
static int matches_any(char *const *globs, size_t n, const ckpt_tensor *t, strbuf *scratch) {
    int best = CLI_GLOB_NO;
    for (size_t i = 0; i < n && best != CLI_GLOB_NAME; i++) {
        int m = cli_glob_match(globs[i], t, scratch);
        if (m && (!best || m < best)) best = m;
    }
    return best;
}

size_t convert_select(ckpt_catalog *cat, char *const *include, size_t ninclude,
                      char *const *exclude, size_t nexclude) {
    size_t kept = 0;
    strbuf scratch;
    sb_init(&scratch);
    for (size_t i = 0; i < cat->ntensors; i++) {
        ckpt_tensor *t = &cat->tensors[i];
        if (t->aside) {
            /* State kept beside the model (optim/) is written when an --include names it
             * with its directory, as `ckptfs ls` prints it; per-rank copies never are. */
            if (!ninclude || cli_hidden(t) || !t->prefix ||
                matches_any(include, ninclude, t, &scratch) != CLI_GLOB_PREFIXED ||
                matches_any(exclude, nexclude, t, &scratch))
                continue;
            t->aside = false;
            kept++;
            continue;
        }
        /* left out = not part of what is written, as per-rank copies are */
        if ((ninclude && !matches_any(include, ninclude, t, &scratch)) ||
            matches_any(exclude, nexclude, t, &scratch))
            t->aside = true;
        else
            kept++;
    }
    sb_free(&scratch);
    return kept;
}
