/* The source's files in the stage: their bytes read through the planner, and copied into the
 * spool ("copy-up") when a file is opened for writing or truncated, only as much as is kept. */
#include "stage_ops.h"

#include "core/util/pwrite_pieces.h"
#include "core/read/segread.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

int stage_read_lower(const ckpt_catalog *cat, size_t tensor, uint64_t off, size_t len, char *buf,
                     size_t *got) {
    const ckpt_tensor *t = &cat->tensors[tensor];
    *got = 0;
    if (off >= t->nbytes) return 0;
    if (len > t->nbytes - off) len = (size_t)(t->nbytes - off);
    while (*got < len) {
        ckpt_segment seg[64];
        uint64_t done;
        size_t n = ckpt_plan(t, off + *got, len - *got, seg, 64, &done);
        if (n == 0) return EIO;
        /* A source that shrank gives EIO: never other bytes. */
        int e = ckpt_read_segments(cat, seg, n, buf + *got, NULL);
        if (e) return -e; /* positive here, as FUSE replies take it */
        *got += (size_t)done;
    }
    return 0;
}

void stage_settle_fd(snode *n) {
    if (n->nopen == 0 && n->fd >= 0) {
        close(n->fd);
        n->fd = -1;
    }
}

int stage_copy_up_keep(stage *st, snode *n, uint64_t keep) {
    uint64_t id;
    int fd = spool_data_create(st, &id);
    if (fd < 0) return -fd;
    int e = 0;
    if (keep && n->src == SRC_LOWER_SIDECAR) {
        size_t len;
        char *text = ckpt_sidecar_json(st->lower, &st->lower->tensors[n->lower], &len);
        e = text ? -pwrite_pieces(fd, text, keep < len ? (size_t)keep : len, 0) : ENOMEM;
        free(text);
    } else if (keep && n->src == SRC_PACK) {
        int pfd = n->fd >= 0 ? n->fd : spool_data_open(st, n->data_id);
        uint64_t size = n->pack_size < keep ? n->pack_size : keep;
        char *buf = malloc(MAX_IO);
        e = pfd < 0 ? -pfd : buf ? 0 : ENOMEM;
        for (uint64_t off = 0; !e && off < size;) {
            size_t want = size - off < MAX_IO ? (size_t)(size - off) : MAX_IO;
            ssize_t got = pread(pfd, buf, want, (off_t)(n->pack_off + off));
            e = got < 0 ? errno : got == 0 ? EIO : -pwrite_pieces(fd, buf, (size_t)got, off);
            if (got > 0) off += (uint64_t)got;
        }
        free(buf);
        if (pfd >= 0 && pfd != n->fd) close(pfd);
    } else if (keep) {
        char *buf = malloc(MAX_IO);
        uint64_t size = n->lower_size < keep ? n->lower_size : keep;
        e = buf ? 0 : ENOMEM;
        for (uint64_t off = 0; !e && off < size;) {
            size_t got, want = size - off < MAX_IO ? (size_t)(size - off) : MAX_IO;
            e = stage_read_lower(st->lower, n->lower, off, want, buf, &got);
            if (!e && got != want) e = EIO;
            if (!e) e = -pwrite_pieces(fd, buf, got, off);
            off += got;
        }
        free(buf);
    }
    sn_src was = n->src;
    uint64_t was_id = n->data_id;
    n->src = SRC_SPOOL;
    n->data_id = id;
    if (!e) e = -journal_file(st, n);
    if (!e) n->late_error = 0; /* its bytes, as they are, in a file of their own */
    if (e) {
        n->src = was;
        n->data_id = was_id;
        close(fd);
        spool_data_unlink(st, id);
        return e;
    }
    if (was == SRC_PACK) {
        stage_pack_drop_tail(st, n); /* its bytes at the pack's end are free again */
        if (n->fd >= 0) close(n->fd);
    }
    n->fd = fd;
    note_uncommitted_change(st);
    return 0;
}

int stage_copy_up(stage *st, snode *n) {
    int e = stage_copy_up_keep(st, n, UINT64_MAX);
    stage_settle_fd(n);
    return e;
}
