#include "mount_opts.h"

#include <stdlib.h>
#include <string.h>

int mount_opts_key(mount_opts *m, const char *arg, int key) {
    switch (key) {
    case FUSE_OPT_KEY_NONOPT:
        if (!m->first)
            m->first = strdup(arg);
        else if (!m->mountpoint)
            m->mountpoint = strdup(arg);
        else
            m->extra_args++;
        return 0;
    case MOUNT_KEY_FOREGROUND:
        m->foreground = 1;
        return 0;
    case MOUNT_KEY_DEBUG: /* libfuse prints every request */
        m->debug = m->foreground = 1;
        return 1;
    case MOUNT_KEY_SINGLE:
        m->single = 1;
        return 0;
    case MOUNT_KEY_HELP:
        m->help = 1;
        return 0;
    case MOUNT_KEY_ALLOW_OTHER: /* libfuse needs it too */
        m->allow_other = 1;
        return 1;
    default:
        return MOUNT_OPTS_NOT_MINE;
    }
}

void mount_opts_free(mount_opts *m) {
    free(m->first);
    free(m->mountpoint);
    free(m->max_threads);
}
