/* What a remote name shows (no secrets) and what it requests (the real URL, or an s3:// / hf://
 * name's signed target): asked of its scheme (schemes.c). */
#include "remote.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

void remote_shown(const char *path, char *out, size_t cap) {
    const remote_scheme *sc = remote_scheme_of(path);
    if (sc && sc->shown)
        sc->shown(path, out, cap);
    else
        snprintf(out, cap, "%s", path);
}

int remote_target_of(const char *path, remote_target *t, ckpt_err *err) {
    sb_init(&t->url);
    t->auth = NULL;
    t->hint = NULL;
    const remote_scheme *sc = remote_scheme_of(path);
    int rc = sc ? sc->target(path, t, err)
                : ckpt_fail(err, -EINVAL, "%s: not a remote name (http://, https://, s3://, hf://)",
                            path);
    if (!rc && t->url.failed) rc = ckpt_fail(err, -ENOMEM, "out of memory");
    if (rc) sb_free(&t->url);
    return rc;
}
