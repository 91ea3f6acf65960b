/* The kinds of remote names, one row each (like curl's table of protocol handlers): every
 * question that depends on the scheme is a field of its row, never a test of the prefix. */
#include "remote.h"

#include <string.h>

static const remote_scheme schemes[] = {
    {.prefix = "s3://", .target = s3_target, .list = s3_list, .kind = s3_kind, .top_dirs = 0},
    {.prefix = "hf://", .target = hf_target, .list = hf_list, .pin = hf_pin, .top_dirs = 1},
    {.prefix = "https://",
     .target = http_target,
     .list = httpdir_list,
     .shown = http_shown,
     .kind = httpdir_kind,
     .top_dirs = -1,
     .partial_listings = true},
    {.prefix = "http://",
     .target = http_target,
     .list = httpdir_list,
     .shown = http_shown,
     .kind = httpdir_kind,
     .top_dirs = -1,
     .partial_listings = true},
};

const remote_scheme *remote_scheme_of(const char *path) {
    for (size_t i = 0; i < sizeof schemes / sizeof *schemes; i++)
        if (strncmp(path, schemes[i].prefix, strlen(schemes[i].prefix)) == 0) return &schemes[i];
    return NULL;
}

bool remote_is_url(const char *path) {
    return remote_scheme_of(path) != NULL;
}

bool ckpt_is_url(const char *path) {
    return remote_is_url(path);
}
