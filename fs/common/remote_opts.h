/* -o options of remote sources (s3_endpoint=, cache_dir=, block_size=, ...), shared by the
 * mount and the subcommands. */
#ifndef CKPTFS_REMOTE_OPTS_H
#define CKPTFS_REMOTE_OPTS_H

#include "core/ckpt.h"

#include <stdbool.h>
#include <stddef.h>

enum { REMOTE_OPT_STRINGS = 4 };

typedef struct remote_opts {
    ckpt_remote_options o;
    char *owned[REMOTE_OPT_STRINGS]; /* the string values, freed by remote_opts_free */
} remote_opts;

/* One "key=value" option: 1 when it is a remote option and was applied, 0 when it is no remote
 * option, -1 when its value is bad (why says what is expected). */
int remote_opts_apply(remote_opts *r, const char *opt, char *why, size_t cap);
void remote_opts_free(remote_opts *r);

#endif
