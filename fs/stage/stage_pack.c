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
 * A commit hands the pack to the writer (ckpt_packed_finish_file, core/write/packed.c): when
 * the staged tensors in it tile it from PACK_DATA_START without a gap, it appends the other
 * tensors (from the source, from data files, from older packs: copy_file_range, which reflinks
 * where the file system can), writes the header in front (padded with spaces up to the data,
 * as the format allows) and fsyncs; the stage links the pack as OUT (a new name, renamed over
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
    char *buf = malloc(PACK_COPY_BUF);
    int rc = buf ? ckpt_packed_finish_file(cat, st->pack_fd, PACK_DATA_START, live, buf,
                                           &st->progress_done, st->out, err)
                 : ckpt_fail(err, -ENOMEM, "out of memory");
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
    free(buf);
    return rc;
}
