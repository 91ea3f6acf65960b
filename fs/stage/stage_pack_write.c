/* What the pack's commits share (one safetensors OUT: stage_pack.c, an HF directory:
 * stage_pack_dir.c, a clone of the source: stage_pack_clone.c): where a pack's staged files
 * end, the file put in place as OUT. Appending tensors, headers, the index and a directory OUT
 * are the writer's (core/write/packed.h). */
#include "stage_pack.h"

#include "core/util/pwrite_pieces.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int placed_cmp(const void *a, const void *b) {
    uint64_t x = ((const placed *)a)->off, y = ((const placed *)b)->off;
    return (x > y) - (x < y);
}

uint64_t pack_live_end(const snode *dir, uint64_t id) {
    uint64_t end = 0;
    for (size_t b = 0; b < dir->nbuckets; b++)
        for (const snode *c = dir->buckets[b]; c; c = c->hash_next) {
            uint64_t e = c->kind == SN_DIR                        ? pack_live_end(c, id)
                         : c->src == SRC_PACK && c->data_id == id ? c->pack_off + c->pack_size
                                                                  : 0;
            if (e > end) end = e;
        }
    return end;
}

int pack_pwrite_all(int fd, const void *p, size_t n, uint64_t at) {
    return pwrite_pieces(fd, p, n, at);
}

int pack_fsync_parent(const char *path) {
    char copy[PATH_MAX];
    snprintf(copy, sizeof copy, "%s", path);
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -errno;
    int rc = fsync(fd) == 0 ? 0 : -errno;
    close(fd);
    return rc;
}

int note_landing(stage *st, int fd, const char *path) {
    if (!stage_replaces_source(st)) return 0;
    struct stat s;
    if (fd >= 0 ? fstat(fd, &s) != 0 : stat(path, &s) != 0) return -errno;
    pthread_mutex_lock(&st->lock);
    int rc = spool_note_landing(st, &s);
    pthread_mutex_unlock(&st->lock);
    return rc;
}

int pack_publish(stage *st, int fd, uint64_t id, ckpt_err *err) {
    char tmp[PATH_MAX], dir[PATH_MAX], base[PATH_MAX], pack[64];
    snprintf(dir, sizeof dir, "%s", st->out);
    snprintf(base, sizeof base, "%s", st->out);
    snprintf(pack, sizeof pack, "/proc/self/fd/%d", fd);
    int rc = note_landing(st, fd, NULL);
    if (rc)
        return ckpt_fail(err, rc, "%s: the spool cannot record the commit: %s", st->out,
                         strerror(-rc));
    for (int attempt = 0;; attempt++) {
        snprintf(tmp, sizeof tmp, "%s/.%s.partial-%llx-%d", dirname(dir), basename(base),
                 (unsigned long long)id, attempt);
        snprintf(dir, sizeof dir, "%s", st->out); /* dirname may have changed it */
        if (linkat(AT_FDCWD, pack, AT_FDCWD, tmp, AT_SYMLINK_FOLLOW) == 0) break;
        if (errno != EEXIST || attempt == 16)
            return ckpt_fail(err, -errno, "%s: cannot link the staged file beside it: %s", st->out,
                             strerror(errno));
    }
    if (rename(tmp, st->out) != 0) {
        int e = errno;
        unlink(tmp);
        return ckpt_fail(err, -e, "%s: rename into place: %s", st->out, strerror(e));
    }
    rc = pack_fsync_parent(st->out);
    if (rc) return ckpt_fail(err, rc, "%s: fsync of its directory failed", st->out);
    return 0;
}
