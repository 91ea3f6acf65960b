#include "argv_secrets.h"

#include "core/ckpt.h"

#include <stdlib.h>
#include <string.h>

/* Where a URL starts in an argument: the whole argument (SOURCE), or after the '=' of an
 * option such as --from=URL; NULL when it holds none. */
static char *url_in(char *arg) {
    if (ckpt_is_url(arg)) return arg;
    char *eq = strchr(arg, '=');
    return eq && ckpt_is_url(eq + 1) ? eq + 1 : NULL;
}

/* The program's own copy, freed at exit (main returns from many places). */
static char **kept;

static void free_kept(void) {
    for (char **p = kept; p && *p; p++) free(*p);
    free(kept);
    kept = NULL;
}

char **argv_hide_secrets(int argc, char **argv) {
    char **copy = calloc((size_t)argc + 1, sizeof *copy);
    if (!copy) return NULL;
    if (!kept) atexit(free_kept);
    kept = copy;
    for (int i = 0; i < argc; i++) {
        copy[i] = strdup(argv[i]);
        if (!copy[i]) {
            for (int k = 0; k < i; k++) free(copy[k]);
            free(copy);
            kept = NULL;
            return NULL;
        }
    }
    for (int i = 0; i < argc; i++) {
        char *url = url_in(argv[i]);
        if (!url) continue;
        size_t len = strlen(url);
        char *shown = malloc(len + 1);
        if (!shown) continue;
        ckpt_shown_name(url, shown, len + 1);
        /* The shown form is never longer: it only drops parts. Pad with NULs so no byte of
         * the secret is left behind the new end. */
        size_t n = strlen(shown);
        if (n <= len && strcmp(shown, url) != 0) {
            memcpy(url, shown, n);
            memset(url + n, 0, len - n);
        }
        free(shown);
    }
    return copy;
}
