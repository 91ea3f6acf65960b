#include "remote_opts.h"

#include "size.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool parse_uint(const char *s, unsigned max, unsigned *out) {
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (!*s || *end || errno || v > max) return false;
    *out = (unsigned)v;
    return true;
}

int remote_opts_apply(remote_opts *r, const char *opt, char *why, size_t cap) {
    static const char *const strings[REMOTE_OPT_STRINGS] = {"s3_endpoint", "s3_region",
                                                            "s3_addressing", "cache_dir"};
    const char *eq = strchr(opt, '=');
    if (!eq) return 0;
    size_t klen = (size_t)(eq - opt);
    const char *v = eq + 1;
    for (int i = 0; i < REMOTE_OPT_STRINGS; i++) {
        if (strlen(strings[i]) != klen || strncmp(opt, strings[i], klen) != 0) continue;
        if (i == 2 && strcmp(v, "path") != 0 && strcmp(v, "virtual") != 0) {
            snprintf(why, cap, "s3_addressing=%s: expected path or virtual", v);
            return -1;
        }
        char *copy = strdup(v);
        if (!copy) {
            snprintf(why, cap, "out of memory");
            return -1;
        }
        free(r->owned[i]);
        r->owned[i] = copy;
        const char **field[] = {&r->o.s3_endpoint, &r->o.s3_region, &r->o.s3_addressing,
                                &r->o.cache_dir};
        *field[i] = copy;
        return 1;
    }
#define KEY(name) (klen == sizeof name - 1 && strncmp(opt, name, klen) == 0)
    if (KEY("cache_size") || KEY("cache_ram") || KEY("block_size")) {
        uint64_t n = 0;
        if (parse_size_option(v, &n) != 0 || n == 0) {
            snprintf(why, cap, "%.*s=%s: expected a size such as 4MiB or 10GB", (int)klen, opt, v);
            return -1;
        }
        *(KEY("cache_size")  ? &r->o.cache_size
          : KEY("cache_ram") ? &r->o.cache_ram
                             : &r->o.block_size) = n;
        return 1;
    }
    if (KEY("prefetch") || KEY("remote_timeout") || KEY("retries")) {
        unsigned n;
        if (!parse_uint(v, KEY("prefetch") ? 64 : 3600, &n) || (KEY("remote_timeout") && !n)) {
            snprintf(why, cap, "%.*s=%s: expected a whole number%s", (int)klen, opt, v,
                     KEY("prefetch")  ? " from 0 to 64"
                     : KEY("retries") ? ""
                                      : " of seconds > 0");
            return -1;
        }
        if (KEY("prefetch")) {
            r->o.prefetch = n;
            r->o.prefetch_set = true;
        } else if (KEY("retries")) {
            r->o.retries = n;
            r->o.retries_set = true;
        } else {
            r->o.timeout = n;
        }
        return 1;
    }
#undef KEY
    return 0;
}

void remote_opts_free(remote_opts *r) {
    for (int i = 0; i < REMOTE_OPT_STRINGS; i++) {
        free(r->owned[i]);
        r->owned[i] = NULL;
    }
}
