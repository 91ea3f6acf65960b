#include "changed.h"

#include "common/mount_log.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const ckpt_catalog *the_cat;
static atomic_bool *said;

bool changed_init(const ckpt_catalog *cat) {
    the_cat = cat;
    said = calloc(cat->nsources ? cat->nsources : 1, sizeof *said);
    return said != NULL;
}

void changed_free(void) {
    free(said);
    said = NULL;
}

static bool same_time(const struct timespec *a, const struct timespec *b) {
    return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

/* What differs between the file at s's path and the one the catalog read. */
static void reason(const ckpt_source *s, char *out, size_t n) {
    struct stat st;
    if (s->remote) {
        snprintf(out, n, "the object changed (other ETag or size than when it was pinned)");
        return;
    }
    if (stat(s->path, &st) != 0) {
        snprintf(out, n, "it is gone (%s)", strerror(errno));
    } else if (st.st_dev != s->dev || st.st_ino != s->ino) {
        snprintf(out, n, "another file took its name (replaced: a new inode)");
    } else if ((uint64_t)st.st_size != ckpt_source_stored_size(s)) {
        snprintf(out, n, "rewritten in place: %llu bytes, %llu when mounted",
                 (unsigned long long)st.st_size, (unsigned long long)ckpt_source_stored_size(s));
    } else if (!same_time(&st.st_mtim, &s->mtime)) {
        snprintf(out, n, "rewritten in place (its modification time moved)");
    } else {
        snprintf(out, n,
                 "its change time moved with the size, mtime and link count the same: rewritten "
                 "with the old mtime put back (cp -p, touch -r), or chmod-ed or chown-ed");
    }
}

void changed_note(const ckpt_source *s) {
    if (!said || !the_cat || s < the_cat->sources || s >= the_cat->sources + the_cat->nsources)
        return;
    if (atomic_exchange(&said[s - the_cat->sources], true)) return;
    char why[300];
    reason(s, why, sizeof why);
    mount_log("%s (mounted from %s): %s; every read of it gives EIO until it is mounted again",
              s->path, the_cat->root, why);
}
