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

/* The program's own copy, freed at exit (main returns from many places). The strings are
 * freed through a list of their own: the program may change its argv array (option parsers
 * move and drop entries), which must not lose a string. */
static char **kept, **given;
static int nkept;

static void free_kept(void) {
    for (int i = 0; i < nkept; i++) free(kept[i]);
    free(kept);
    free(given);
    kept = given = NULL;
    nkept = 0;
}

char **argv_hide_secrets(int argc, char **argv) {
    if (kept) return NULL; /* once per process */
    char **copy = calloc((size_t)argc + 1, sizeof *copy);
    char **mine = calloc((size_t)argc + 1, sizeof *mine);
    if (!copy || !mine) {
        free(copy);
        free(mine);
        return NULL;
    }
    for (int i = 0; i < argc; i++) {
        copy[i] = mine[i] = strdup(argv[i]);
        if (!copy[i]) {
            for (int k = 0; k < i; k++) free(mine[k]);
            free(copy);
            free(mine);
            return NULL;
        }
    }
    kept = mine;
    given = copy;
    nkept = argc;
    atexit(free_kept);
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
