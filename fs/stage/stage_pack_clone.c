/* A safetensors OUT that is a file of the source with some tensors rewritten: a clone of that
 * file, with the changed tensors written over their old bytes.
 *
 * A stage --from a safetensors file (typically OUT itself) whose tree still has exactly that
 * file's tensors, by name, dtype and shape, some of them with new bytes (a fine-tuned layer
 * copied over its old file), needs no copy of the others where the file system shares extents
 * (FICLONE: XFS with reflink, Btrfs, bcachefs, OCFS2...). The commit clones the file into a
 * new data file of the spool (the clone is O(extents), not O(bytes)), writes each changed
 * tensor at its place in the clone, fsyncs it and links it as OUT: the commit costs what
 * changed. The header stays the file's own; it describes the same tensors at the same places.
 *
 * The source file is only read (the old OUT stays intact until the rename); a kill leaves a
 * data file nothing refers to, which the stage's clean-up removes. Where FICLONE is refused
 * (ext4 here: EOPNOTSUPP; another file system: EXDEV) the commit goes the pack's way. */
#include "stage_pack_whole.h"

#include "core/write/writer.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct rewrite {
    size_t tensor;
    uint64_t at; /* its place in the file */
} rewrite;

/* The local source file holding the most staged tensors as they are, or UINT32_MAX. */
static uint32_t base_source(const ckpt_catalog *cat) {
    uint32_t best = UINT32_MAX;
    size_t *count = calloc(cat->nsources ? cat->nsources : 1, sizeof *count), most = 0;
    for (size_t i = 0; count && i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        if (t->aside || t->npieces != 1 || t->pieces[0].strides) continue;
        const ckpt_source *s = &cat->sources[t->pieces[0].source];
        if (!ckpt_source_whole_file(s) || s->owned) continue;
        if (++count[t->pieces[0].source] > most) {
            most = count[t->pieces[0].source];
            best = t->pieces[0].source;
        }
    }
    free(count);
    return best;
}

/* The tensors of the staged catalog that must be written into a clone of the file behind fd:
 * 0 with *out (malloc'd) and *n, or 1 when the file is not exactly the staged tensors' layout
 * (ckpt_packed_layout). */
static int plan_rewrites(const ckpt_catalog *cat, int fd, rewrite **out, size_t *n) {
    *out = NULL;
    *n = 0;
    struct stat fs;
    ckpt_placed *layout;
    size_t nl;
    if (fstat(fd, &fs) != 0 || !S_ISREG(fs.st_mode) ||
        ckpt_packed_layout(cat, fd, (uint64_t)fs.st_size, &layout, &nl) != 0)
        return 1;
    rewrite *w = malloc((nl ? nl : 1) * sizeof *w);
    if (!w) {
        free(layout);
        return 1;
    }
    size_t nw = 0;
    for (size_t k = 0; k < nl; k++) {
        const ckpt_tensor *t = &cat->tensors[layout[k].tensor];
        /* the same file may be two sources: OUT as the source's reader opened it, and the
         * spool's pack that a commit linked as OUT, which staged files still refer to */
        const ckpt_source *ts = t->npieces == 1 ? &cat->sources[t->pieces[0].source] : NULL;
        bool in_place = ts && !t->pieces[0].strides &&
                        ckpt_source_is_file(ts, fs.st_dev, fs.st_ino) &&
                        t->pieces[0].file_offset == layout[k].off;
        if (!in_place) w[nw++] = (rewrite){layout[k].tensor, layout[k].off};
    }
    free(layout);
    *out = w;
    *n = nw;
    return 0;
}

int stage_pack_clone_commit(stage *st, ckpt_catalog *cat, ckpt_err *err) {
    if (st->no_clone) return 1;
    uint32_t u = base_source(cat);
    if (u == UINT32_MAX) return 1;
    int base = ckpt_source_open_again(&cat->sources[u]);
    if (base < 0) return 1;
    rewrite *w;
    size_t nw;
    if (plan_rewrites(cat, base, &w, &nw) != 0) {
        close(base);
        return 1;
    }
    uint64_t id;
    pthread_mutex_lock(&st->lock);
    int fd = spool_data_create(st, &id);
    pthread_mutex_unlock(&st->lock);
    if (fd < 0 || ioctl(fd, FICLONE, base) != 0) {
        /* not a file system that shares extents (or not both files on it): the pack's way,
         * and no more tries while this stage lives */
        if (fd >= 0) {
            st->no_clone = true;
            close(fd);
            spool_data_unlink(st, id);
        }
        close(base);
        free(w);
        return 1;
    }
    close(base);
    char *buf = malloc(PACK_COPY_BUF);
    int rc = buf ? 0 : ckpt_fail(err, -ENOMEM, "out of memory");
    /* The tensors kept in place are the clone's: the source's own bytes only if it is still the
     * file the catalog saw once the clone is made (a write moves mtime and ctime first). */
    if (!rc && !ckpt_source_unchanged(&cat->sources[u]))
        rc = ckpt_fail(err, -EIO, "%s: changed while it was cloned into the staged file",
                       cat->sources[u].path);
    for (size_t k = 0; !rc && k < nw; k++) {
        const ckpt_tensor *t = &cat->tensors[w[k].tensor];
        int e = ckpt_packed_append(cat, t, fd, w[k].at, buf, &st->progress_done);
        if (e)
            rc = ckpt_fail(err, e, "%s: writing tensor \"%.*s\" into the clone of its file: %s",
                           st->out, (int)(t->name_len > 120 ? 120 : t->name_len), t->name,
                           strerror(-e));
    }
    free(buf);
    free(w);
    if (!rc) fchmod(fd, 0666 & ~ckpt_umask()); /* spool files are 0600 */
    if (!rc && fsync(fd) != 0)
        rc = ckpt_fail(err, -errno, "%s: fsync: %s", st->out, strerror(errno));
    if (!rc) rc = pack_publish(st, fd, id, err);
    close(fd);
    pthread_mutex_lock(&st->lock);
    spool_data_unlink(st, id); /* OUT's alone now, or nothing */
    pthread_mutex_unlock(&st->lock);
    return rc;
}
