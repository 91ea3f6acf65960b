/* The pack: for a safetensors OUT, staged tensor bytes are written once, into the file that
 * becomes OUT.
 *
 * A pack is a data file of the spool (data/ID) that starts with PACK_DATA_START reserved
 * bytes. A new file whose name can be a tensor (not a sidecar, .npy, hidden or HF folder file)
 * becomes the owner of the pack's tail when nobody owns it: its bytes go at the end of the
 * pack, as they come. The journal says where it starts ("p PATH MODE ID OFF") and, once it is
 * closed, its size ("s PATH SIZE"); a file still owning the tail at a crash ends where the
 * pack ends. Files made while another owns the tail, and files written again after they were
 * closed, live in data files of their own as before.
 *
 * A commit whose tensors in the pack tile it from PACK_DATA_START without a gap appends the
 * other tensors (from the source, from data files, from older packs: copy_file_range, which
 * reflinks where the file system can), writes the header in front (padded with spaces up to
 * the data, as the format allows), fsyncs, and links the pack as OUT (a new name, renamed over
 * OUT). OUT and data/ID are then one file; the stage appends to a new pack from there on. A
 * pack with holes (files removed, rewritten or truncated after they were written), or whose
 * header does not fit, is committed by ckpt_write as before: the compaction is that copy. */
#include "stage_pack.h"

#include "core/write/writer.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The header written in front of the pack. */
static int write_header(const ckpt_catalog *cat, const placed *p, size_t n, int out) {
    char *head;
    int e = pack_header(cat, p, n, &head);
    if (e) return e;
    e = pack_pwrite_all(out, head, PACK_DATA_START, 0);
    free(head);
    return e;
}

int stage_pack_commit(stage *st, ckpt_catalog *cat, const ckpt_write_opts *opts, ckpt_err *err) {
    pthread_mutex_lock(&st->lock);
    stage_pack_seal(st); /* nothing is written during a commit; sizes are final */
    int mode = stage_pack_mode(st);
    pthread_mutex_unlock(&st->lock);
    if (mode == PACK_DIR) return stage_pack_dir_commit(st, cat, opts, err);
    /* the source's file with a few tensors rewritten: a clone of it, where extents are shared */
    int cloned = mode == PACK_FILE ? stage_pack_clone_commit(st, cat, err) : 1;
    if (cloned != 1) return cloned;
    pthread_mutex_lock(&st->lock);
    bool go = mode == PACK_FILE && (st->pack_fd >= 0 || pack_open_new(st) == 0);
    uint64_t id = st->pack_id, live = go ? pack_live_end(st->root, id) : 0;
    pthread_mutex_unlock(&st->lock);
    if (!go) return 1;
    struct stat ps;
    if (fstat(st->pack_fd, &ps) != 0) return 1;

    placed *in = malloc((cat->ntensors ? cat->ntensors : 1) * sizeof *in);
    size_t *rest = malloc((cat->ntensors ? cat->ntensors : 1) * sizeof *rest);
    char *buf = malloc(PACK_COPY_BUF);
    size_t nin = 0, nrest = 0;
    int rc = in && rest && buf ? 0 : ckpt_fail(err, -ENOMEM, "out of memory");
    for (size_t i = 0; !rc && i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        if (t->aside) continue;
        if (!pack_fits_safetensors(t)) {
            rc = 1;
            break;
        }
        const ckpt_piece *p = t->npieces == 1 ? &t->pieces[0] : NULL;
        const ckpt_source *s = p ? &cat->sources[p->source] : NULL;
        if (s && !p->strides && s->dev == ps.st_dev && s->ino == ps.st_ino && !s->member_of &&
            t->nbytes)
            in[nin++] = (placed){i, p->file_offset};
        else
            rest[nrest++] = i;
    }
    /* The tensors in the pack must tile it from the data start: a gap is a hole. */
    uint64_t at = PACK_DATA_START;
    if (!rc && nin) qsort(in, nin, sizeof *in, placed_cmp);
    for (size_t k = 0; !rc && k < nin; k++) {
        if (in[k].off != at) rc = 1;
        at += cat->tensors[in[k].tensor].nbytes;
    }
    if (!rc && live > at) rc = 1; /* a staged file that is no tensor lies beyond */
    if (!rc && nrest) qsort_r(rest, nrest, sizeof *rest, pack_width_cmp, cat);
    placed *all = rc ? NULL : realloc(in, (nin + nrest ? nin + nrest : 1) * sizeof *in);
    if (!rc && !all) rc = ckpt_fail(err, -ENOMEM, "out of memory");
    if (all) in = all;
    for (size_t k = 0; !rc && k < nrest; k++) {
        const ckpt_tensor *t = &cat->tensors[rest[k]];
        int e = pack_append_tensor(st, cat, t, st->pack_fd, at, buf);
        if (e)
            rc = ckpt_fail(err, e, "%s: appending tensor \"%.*s\" to the staged file: %s", st->out,
                           (int)(t->name_len > 120 ? 120 : t->name_len), t->name, strerror(-e));
        in[nin++] = (placed){rest[k], at};
        at += t->nbytes;
    }
    if (!rc) {
        int e = write_header(cat, in, nin, st->pack_fd);
        if (e < 0) rc = ckpt_fail(err, e, "%s: writing the header: %s", st->out, strerror(-e));
        if (e > 0) rc = 1; /* too many names for the reserved room */
    }
    if (!rc && ftruncate(st->pack_fd, (off_t)at) != 0)
        rc = ckpt_fail(err, -errno, "%s: truncating the staged file: %s", st->out, strerror(errno));
    if (!rc) /* spool files are 0600; OUT gets the umask's mode, limited by the sources' */
        fchmod(st->pack_fd, ckpt_output_mode(cat));
    if (!rc && fsync(st->pack_fd) != 0)
        rc = ckpt_fail(err, -errno, "%s: fsync: %s", st->out, strerror(errno));
    if (!rc) rc = pack_publish(st, st->pack_fd, st->pack_id, err);
    if (!rc) {
        /* The pack is OUT now: never appended to again. */
        pthread_mutex_lock(&st->lock);
        close(st->pack_fd);
        st->pack_fd = -1;
        pthread_mutex_unlock(&st->lock);
    } else if (rc == 1 || rc < 0) {
        /* Appended bytes lie beyond every staged file: the pack's end is where they were. */
        pthread_mutex_lock(&st->lock);
        if (ftruncate(st->pack_fd, (off_t)(live > PACK_DATA_START ? live : PACK_DATA_START)) == 0)
            st->pack_end = live > PACK_DATA_START ? live : PACK_DATA_START;
        pthread_mutex_unlock(&st->lock);
    }
    free(in);
    free(rest);
    free(buf);
    return rc;
}
