/* Where a stage's OUT and spool are, as absolute paths, whichever command asks (ckptfs stage,
 * stage --status, umount). */
#include "stage.h"
#include "common/message.h"
#include "stage_fs.h"

#include "core/write/writer.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* OUT made absolute (its directory must exist), keeping a trailing '/' that asks for an HF
 * directory. The names ckpt_write understands are checked now, not at the first commit. */
char *stage_out_path(const char *out) {
    size_t n = strlen(out);
    bool dir_form = n && out[n - 1] == '/';
    char *trimmed = strdup(out);
    if (!trimmed) return NULL;
    while (n > 1 && trimmed[n - 1] == '/') trimmed[--n] = '\0';
    char *d = strdup(trimmed), *b = strdup(trimmed);
    char dir[PATH_MAX];
    char *result = NULL;
    struct stat s;
    if (!d || !b) {
        msg_error("stage", "out of memory");
    } else if (!realpath(dirname(d), dir)) {
        msg_error("stage", "OUT %s: its directory cannot be used: %s", out, strerror(errno));
    } else {
        const char *base = basename(b);
        bool is_dir = dir_form || (stat(trimmed, &s) == 0 && S_ISDIR(s.st_mode));
        if (!ckpt_writer_for(out) || strcmp(base, "/") == 0 || strcmp(base, ".") == 0 ||
            strcmp(base, "..") == 0) {
            msg_error("stage",
                      "OUT %s: cannot tell the format from the name (use %s, any of "
                      "them + .zst, or DIR/ for a Hugging Face directory)",
                      out, ckpt_writer_suffixes());
        } else if ((result = malloc(strlen(dir) + strlen(base) + 3))) {
            sprintf(result, "%s%s%s%s", dir, strcmp(dir, "/") ? "/" : "", base, is_dir ? "/" : "");
        }
    }
    free(d);
    free(b);
    free(trimmed);
    return result;
}

/* The spool: -o spool=DIR (its parent must exist), or .NAME.stage next to OUT. */
char *stage_spool_path(const char *out_abs, const char *opt) {
    char *copy = strdup(opt ? opt : out_abs), *copy2 = strdup(opt ? opt : out_abs);
    char *result = NULL;
    if (copy && copy2) {
        size_t n = strlen(copy);
        while (n > 1 && copy[n - 1] == '/') {
            n--;
            copy[n] = copy2[n] = '\0';
        }
        char dir[PATH_MAX];
        const char *base = basename(copy2);
        if (!realpath(dirname(copy), dir)) {
            msg_error("stage", "spool %s: its directory cannot be used: %s", opt ? opt : out_abs,
                      strerror(errno));
        } else if ((result = malloc(strlen(dir) + strlen(base) + 16))) {
            sprintf(result, "%s/%s%s%s", strcmp(dir, "/") ? dir : "", opt ? "" : ".", base,
                    opt ? "" : ".stage");
        }
    }
    free(copy);
    free(copy2);
    return result;
}

char *stage_spool_of(const char *out, const char *spool_opt) {
    char *abs = stage_out_path(out);
    char *spool = abs ? stage_spool_path(abs, spool_opt) : NULL;
    free(abs);
    return spool;
}
