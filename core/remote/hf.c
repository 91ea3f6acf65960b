#include "remote.h"

#include <errno.h>
#include <stdio.h>

int hf_target(const char *path, remote_target *t, ckpt_err *err) {
    (void)t;
    return ckpt_fail(err, -EPROTONOSUPPORT, "%s: hf:// not built yet", path);
}

int hf_list(const char *dir, remote_entry **out, size_t *n, ckpt_err *err) {
    *out = NULL;
    *n = 0;
    return ckpt_fail(err, -EPROTONOSUPPORT, "%s: hf:// not built yet", dir);
}

int hf_pin(const char *path, char *out, size_t cap, ckpt_err *err) {
    (void)out, (void)cap;
    return ckpt_fail(err, -EPROTONOSUPPORT, "%s: hf:// not built yet", path);
}
