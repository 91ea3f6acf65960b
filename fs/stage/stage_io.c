/* File contents in the staging mount: reads and writes go to the spool's data files with
 * pread/pwrite outside the tree lock; the source's files are read through the planner, and
 * copied into the spool when opened for writing or truncated (stage_copy_up.c). The control
 * files answer from text made at open (status) or by the commit run through the handle. */
#include "stage_ops.h"

#include "core/util/pwrite_pieces.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Writes reach the spool in pieces (core/util/pwrite_pieces.h says why), not as the 1 MiB a FUSE
 * WRITE brings. */
enum { WRITEBACK_STEP = 8 << 20 };

/* ---- write-behind ----
 * A write into the pack by the file that owns its tail is answered as soon as its bytes are in
 * our buffer, and made (pwrite) after: the writer reads its next chunk meanwhile, instead of
 * waiting for our copy into the page cache, the larger part of the daemon's work. `cp -r` of
 * 2 GiB + commit, 5 rounds with the order rotated, load ~5 on the 2 cores: 1.22-1.35 s
 * (median 1.30) with it against 1.43-1.69 s (1.48) without, cp + sync 1.43-1.86 s (1.50);
 * without it one loop thread (-o max_threads=1) did as well (1.26 s), with it 8 threads do.
 *
 * The writes are made in the order they were answered (a ticket each), so the pack holds a
 * prefix of what was written at any moment, as before. Whatever looks at the bytes or the
 * sizes first waits for the writes answered before it (stage_wb_drain, stage_lock_drained):
 * read, flush (close), fsync, release, truncation, a new open for writing, fallocate; a
 * commit waits through the gate, which each write holds until it is made. A write that fails
 * after it was answered (a full disk) leaves the file ending where it began, and the error
 * comes back from the next write, from the writer's close (flush) and from fsync, as a local
 * file system reports a failed write-back; a close that returned 0 means every byte is in the
 * spool. Nobody waits for the writes holding st->lock: a failed write takes it. */

static uint64_t wb_ticket(stage *st) {
    pthread_mutex_lock(&st->wb_lock);
    uint64_t t = st->wb_next++;
    pthread_mutex_unlock(&st->wb_lock);
    return t;
}

static void wb_wait_turn(stage *st, uint64_t ticket) {
    pthread_mutex_lock(&st->wb_lock);
    while (st->wb_done != ticket) pthread_cond_wait(&st->wb_cond, &st->wb_lock);
    pthread_mutex_unlock(&st->wb_lock);
}

static void wb_finish(stage *st) {
    pthread_mutex_lock(&st->wb_lock);
    st->wb_done++;
    pthread_cond_broadcast(&st->wb_cond);
    pthread_mutex_unlock(&st->wb_lock);
}

void stage_wb_drain(stage *st) {
    pthread_mutex_lock(&st->wb_lock);
    uint64_t answered = st->wb_next;
    while (st->wb_done < answered) pthread_cond_wait(&st->wb_cond, &st->wb_lock);
    pthread_mutex_unlock(&st->wb_lock);
}

/* Tickets are given under st->lock: holding it with none outstanding, no write can be answered
 * until it is let go, so a truncation under it comes after every write answered before. */
void stage_lock_drained(stage *st) {
    for (;;) {
        pthread_mutex_lock(&st->lock);
        pthread_mutex_lock(&st->wb_lock);
        bool idle = st->wb_done == st->wb_next;
        pthread_mutex_unlock(&st->wb_lock);
        if (idle) return;
        pthread_mutex_unlock(&st->lock);
        stage_wb_drain(st);
    }
}

/* A file in the pack: the owner of the tail grows or shrinks there; another only shrinks
 * (the rest becomes a hole). Returns -1 when it must be copied out first. */
static int set_pack_size(stage *st, snode *n, uint64_t size) {
    if (stage_pack_writable(st, n)) {
        int fd = n->fd >= 0 ? n->fd : spool_data_open(st, n->data_id);
        if (fd < 0) return -fd;
        int e = ftruncate(fd, (off_t)(n->pack_off + size)) == 0 ? 0 : errno;
        if (fd != n->fd) close(fd);
        if (e) return e;
        n->pack_size = size;
        st->pack_end = n->pack_off + size;
        note_uncommitted_change(st);
        return 0;
    }
    if (size > n->pack_size) return -1;
    uint64_t was = n->pack_size;
    n->pack_size = size;
    int e = -journal_pack_size(st, n);
    if (e)
        n->pack_size = was;
    else
        note_uncommitted_change(st);
    return e;
}

int stage_set_size(stage *st, snode *n, uint64_t size) {
    if (n->kind != SN_FILE) return EISDIR;
    n->late_error = 0; /* a size set anew: what failed is cut off or a hole now */
    if (n->src == SRC_PACK) {
        int pe = set_pack_size(st, n, size);
        if (pe >= 0) return pe;
    }
    int e = n->src != SRC_SPOOL ? stage_copy_up_keep(st, n, size) : 0;
    if (e) return e;
    int fd = n->fd >= 0 ? n->fd : spool_data_open(st, n->data_id);
    if (fd < 0) return -fd;
    if (ftruncate(fd, (off_t)size) != 0) e = errno;
    if (fd != n->fd) close(fd);
    stage_settle_fd(n);
    if (!e) note_uncommitted_change(st);
    return e;
}

void stage_op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    stage *st = st_of(req);
    snode *n = node_of(st, ino);
    bool writing = (fi->flags & O_ACCMODE) != O_RDONLY, trunc = (fi->flags & O_TRUNC) != 0;
    handle *h = calloc(1, sizeof *h);
    if (!h) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    h->node = n;
    h->writer = writing;
    fi->fh = (uintptr_t)h;
    if (n->kind == SN_STATUS || n->kind == SN_COMMIT) {
        if (n->kind == SN_STATUS && writing) {
            free(h);
            fuse_reply_err(req, EACCES);
            return;
        }
        if (n->kind == SN_STATUS) h->text = stage_status_json(st, &h->len);
        fi->direct_io = 1; /* made on each open: the kernel must not cache or size it */
        handle_track(st, h);
        if (fuse_reply_open(req, fi) != 0) handle_release(st, h);
        return;
    }
    if (n->kind != SN_FILE) {
        free(h);
        fuse_reply_err(req, EISDIR);
        return;
    }
    bool changes = writing || trunc;
    if (changes && !gate_enter(st)) {
        free(h);
        fuse_reply_err(req, EBUSY);
        return;
    }
    if (changes)
        stage_lock_drained(st); /* a truncation or a move comes after the writes answered */
    else
        pthread_mutex_lock(&st->lock);
    int e = 0;
    if (changes && n->src == SRC_PACK && !stage_pack_writable(st, n)) {
        /* written again after it was closed: it starts over at the pack's end, or moves out */
        if (!trunc || stage_pack_claim(st, n, n->name) != 0)
            e = stage_copy_up_keep(st, n, trunc ? 0 : UINT64_MAX);
        else
            note_uncommitted_change(st);
    } else if (changes && n->src != SRC_SPOOL && n->src != SRC_PACK) {
        /* a source tensor replaced (cp over it): its new bytes go to the pack as a new file's */
        if (!trunc || stage_pack_claim(st, n, n->name) != 0)
            e = stage_copy_up_keep(st, n, trunc ? 0 : UINT64_MAX);
        else
            note_uncommitted_change(st);
    } else if (trunc) {
        e = stage_set_size(st, n, 0);
    }
    if (!e && (n->src == SRC_SPOOL || n->src == SRC_PACK) && n->fd < 0) {
        n->fd = spool_data_open(st, n->data_id);
        if (n->fd < 0) {
            e = -n->fd;
            n->fd = -1;
        }
    }
    if (!e && n->src == SRC_LOWER_RAW) {
        h->cat = st->lower;
        h->lower = n->lower;
    }
    if (!e && n->src == SRC_LOWER_SIDECAR) {
        h->text = ckpt_sidecar_json(st->lower, &st->lower->tensors[n->lower], &h->len);
        if (!h->text) e = ENOMEM;
    }
    if (!e)
        n->nopen++;
    else
        stage_settle_fd(n); /* a copy-up may have opened it */
    pthread_mutex_unlock(&st->lock);
    if (changes) gate_leave(st);
    if (e) {
        free(h->text);
        free(h);
        fuse_reply_err(req, e);
        return;
    }
    fi->keep_cache = 0;
    fi->direct_io = (fi->flags & O_ACCMODE) == O_WRONLY; /* as for files it creates */
    handle_track(st, h);
    if (fuse_reply_open(req, fi) != 0) handle_release(st, h);
}

static void reply_text(fuse_req_t req, const char *text, size_t len, size_t size, off_t off) {
    if (!text || (uint64_t)off >= len) {
        fuse_reply_buf(req, NULL, 0);
        return;
    }
    size_t n = len - (size_t)off < size ? len - (size_t)off : size;
    /* From a copy: once the reply is in, the reader may close the file, and its RELEASE (on
     * another thread) frees the handle's text while fuse_reply_buf is still returning. */
    char *copy = malloc(n);
    if (!copy) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    memcpy(copy, text + off, n);
    fuse_reply_buf(req, copy, n);
    free(copy);
}

void stage_op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                   struct fuse_file_info *fi) {
    (void)ino;
    stage *st = st_of(req);
    handle *h = handle_of(fi);
    snode *n = h->node;
    if (size > MAX_IO) size = MAX_IO;
    if (n->kind == SN_COMMIT && !h->text) {
        /* no commit through this handle: the last one's report */
        pthread_mutex_lock(&st->lock);
        if (st->last_report) {
            h->text = strdup(st->last_report);
            h->len = h->text ? strlen(h->text) : 0;
        }
        pthread_mutex_unlock(&st->lock);
    }
    if (n->kind != SN_FILE) {
        reply_text(req, h->text, h->len, size, off);
        return;
    }
    stage_wb_drain(st); /* the bytes of writes answered before */
    pthread_mutex_lock(&st->lock);
    sn_src src = n->src;
    int fd = n->fd;
    pthread_mutex_unlock(&st->lock);
    if (src == SRC_SPOOL && fd < 0) {
        fuse_reply_err(req, EIO); /* cannot happen: an open handle keeps the data file open */
    } else if (src == SRC_PACK) {
        pthread_mutex_lock(&st->lock);
        uint64_t base = n->pack_off, end = n->pack_size;
        pthread_mutex_unlock(&st->lock);
        if (fd < 0 || (uint64_t)off >= end) {
            fd < 0 ? fuse_reply_err(req, EIO) : fuse_reply_buf(req, NULL, 0);
            return;
        }
        if (size > end - (uint64_t)off) size = (size_t)(end - (uint64_t)off);
        struct fuse_bufvec buf = FUSE_BUFVEC_INIT(size);
        buf.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
        buf.buf[0].fd = fd;
        buf.buf[0].pos = (off_t)(base + (uint64_t)off);
        fuse_reply_data(req, &buf, FUSE_BUF_SPLICE_MOVE);
    } else if (src == SRC_SPOOL) {
        struct fuse_bufvec buf = FUSE_BUFVEC_INIT(size);
        buf.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
        buf.buf[0].fd = fd;
        buf.buf[0].pos = off;
        fuse_reply_data(req, &buf, FUSE_BUF_SPLICE_MOVE);
    } else if (src == SRC_LOWER_SIDECAR) {
        reply_text(req, h->text, h->len, size, off);
    } else {
        char *buf = malloc(size ? size : 1);
        size_t got;
        int e = !h->cat ? EIO
                : buf   ? stage_read_lower(h->cat, h->lower, (uint64_t)off, size, buf, &got)
                        : ENOMEM;
        if (e)
            fuse_reply_err(req, e);
        else
            fuse_reply_buf(req, buf, got);
        free(buf);
    }
}

/* The write of an answered pack write, on its turn (see write-behind above). */
static void write_behind(stage *st, snode *n, int fd, const char *buf, size_t size, uint64_t off) {
    if (n->late_error) return; /* set by the write before, on its turn: the file ends there */
    uint64_t at = n->pack_off + off;
    int e = -pwrite_pieces(fd, buf, size, at);
    if (e) {
        pthread_mutex_lock(&st->lock);
        n->late_error = e;
        if (n->pack_size > off) {
            n->pack_size = off; /* what it holds: a prefix of what was written */
            if (n == st->pack_tail && ftruncate(fd, (off_t)at) == 0) st->pack_end = at;
        }
        pthread_mutex_unlock(&st->lock);
        return;
    }
    /* The pack is OUT's bytes: writeback starts as they come (every 8 MiB), so the commit's
     * fsync waits for little and its time does not grow with the data. */
    if ((at + size) / WRITEBACK_STEP != at / WRITEBACK_STEP) {
        uint64_t done = (at + size) / WRITEBACK_STEP * WRITEBACK_STEP; /* a window just filled */
        sync_file_range(fd, (off_t)(done - WRITEBACK_STEP), WRITEBACK_STEP, SYNC_FILE_RANGE_WRITE);
    }
}

/* A write to .ckptfs/commit: the commit runs on a thread of its own, which replies, so that
 * the loop (one thread by default) answers .ckptfs/status and lookups meanwhile. The writer
 * waits in write() for the reply, so its handle stays open until then. */
typedef struct commit_job {
    fuse_req_t req;
    handle *h;
    size_t size;
} commit_job;

static void run_commit(commit_job *job) {
    stage *st = st_of(job->req);
    char *report = NULL;
    int status = stage_commit(st, &report);
    free(job->h->text);
    job->h->text = report;
    job->h->len = report ? strlen(report) : 0;
    if (status == STAGE_OK)
        fuse_reply_write(job->req, job->size);
    else
        fuse_reply_err(job->req, status == STAGE_INVALID ? EINVAL : EIO);
}

static void *commit_thread(void *arg) {
    commit_job *job = arg;
    stage *st = st_of(job->req);
    run_commit(job);
    free(job);
    atomic_fetch_sub(&st->commit_threads, 1);
    return NULL;
}

void stage_op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
                    struct fuse_file_info *fi) {
    (void)ino;
    stage *st = st_of(req);
    handle *h = handle_of(fi);
    snode *n = h->node;
    if (n->kind == SN_COMMIT) {
        commit_job *job = malloc(sizeof *job);
        pthread_t t;
        pthread_attr_t attr;
        bool started = false;
        if (job && pthread_attr_init(&attr) == 0) {
            *job = (commit_job){req, h, size};
            pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            atomic_fetch_add(&st->commit_threads, 1);
            started = pthread_create(&t, &attr, commit_thread, job) == 0;
            if (!started) atomic_fetch_sub(&st->commit_threads, 1);
            pthread_attr_destroy(&attr);
        }
        if (!started) { /* no thread to be had: the commit runs on this one */
            commit_job here = {req, h, size};
            free(job);
            run_commit(&here);
        }
        return;
    }
    if (n->kind != SN_FILE) {
        fuse_reply_err(req, EBADF);
        return;
    }
    if (!gate_enter(st)) {
        fuse_reply_err(req, EBUSY);
        return;
    }
    pthread_mutex_lock(&st->lock);
    int e = n->late_error; /* an earlier write failed after it was answered */
    /* a file of the pack that no longer owns its tail (a commit sealed it) moves out first */
    if (!e && n->src == SRC_PACK && !stage_pack_writable(st, n))
        e = stage_copy_up_keep(st, n, UINT64_MAX);
    int fd = n->src == SRC_SPOOL || n->src == SRC_PACK ? n->fd : -1;
    uint64_t base = n->src == SRC_PACK ? n->pack_off : 0;
    if (!e && fd >= 0 && n->src == SRC_PACK) {
        uint64_t ticket = wb_ticket(st);
        stage_pack_grew(st, n, (uint64_t)off + size);
        note_uncommitted_change(st);
        pthread_mutex_unlock(&st->lock);
        fuse_reply_write(req, size);
        wb_wait_turn(st, ticket);
        write_behind(st, n, fd, buf, size, (uint64_t)off);
        wb_finish(st);
        gate_leave(st);
        return;
    }
    pthread_mutex_unlock(&st->lock);
    if (!e) e = fd >= 0 ? -pwrite_pieces(fd, buf, size, base + (uint64_t)off) : EBADF;
    if (!e && !st->dirty) {
        pthread_mutex_lock(&st->lock);
        stage_pack_grew(st, n, (uint64_t)off + size);
        note_uncommitted_change(st);
        pthread_mutex_unlock(&st->lock);
    }
    gate_leave(st);
    if (e)
        fuse_reply_err(req, e);
    else
        fuse_reply_write(req, size);
}

/* A close: its writes are made, and one that failed after it was answered says so here. */
void stage_op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)ino;
    stage *st = st_of(req);
    handle *h = handle_of(fi);
    stage_wb_drain(st);
    pthread_mutex_lock(&st->lock);
    int e = h->writer && h->node->kind == SN_FILE ? h->node->late_error : 0;
    pthread_mutex_unlock(&st->lock);
    fuse_reply_err(req, e);
}

void handle_track(stage *st, handle *h) {
    pthread_mutex_lock(&st->handles_lock);
    h->next = st->handles;
    if (h->next) h->next->prev = &h->next;
    h->prev = &st->handles;
    st->handles = h;
    pthread_mutex_unlock(&st->handles_lock);
}

void handle_untrack(stage *st, handle *h) {
    pthread_mutex_lock(&st->handles_lock);
    if (h->prev) {
        *h->prev = h->next;
        if (h->next) h->next->prev = h->prev;
        h->prev = NULL;
        h->next = NULL;
    }
    pthread_mutex_unlock(&st->handles_lock);
}

void handle_release(stage *st, handle *h) {
    snode *n = h->node;
    if (n->kind == SN_FILE) {
        pthread_mutex_lock(&st->lock);
        if (n->nopen) n->nopen--;
        if (n->nopen == 0 && n == st->pack_tail) {
            if (n->removed)
                stage_pack_drop_tail(st, n);
            else
                stage_pack_seal(st);
        }
        stage_settle_fd(n);
        tree_release_if_unused(n);
        pthread_mutex_unlock(&st->lock);
    }
    handle_untrack(st, h);
    free(h->text);
    free(h);
}

void stage_op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)ino;
    stage_wb_drain(st_of(req)); /* the writes use the node's descriptor */
    handle_release(st_of(req), handle_of(fi));
    fuse_reply_err(req, 0);
}

void stage_op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi) {
    (void)ino;
    stage *st = st_of(req);
    snode *n = handle_of(fi)->node;
    stage_wb_drain(st);
    pthread_mutex_lock(&st->lock);
    int fd = n->kind == SN_FILE && (n->src == SRC_SPOOL || n->src == SRC_PACK) ? n->fd : -1;
    int late = n->kind == SN_FILE ? n->late_error : 0;
    pthread_mutex_unlock(&st->lock);
    /* The handle keeps fd open; the journal only ever grows under appends. */
    int e = late ? late : fd >= 0 && (datasync ? fdatasync(fd) : fsync(fd)) != 0 ? errno : 0;
    if (!e) e = -journal_sync(st);
    fuse_reply_err(req, e);
}

void stage_op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length,
                        struct fuse_file_info *fi) {
    (void)ino;
    stage *st = st_of(req);
    snode *n = handle_of(fi)->node;
    if (n->kind != SN_FILE) {
        fuse_reply_err(req, EBADF);
        return;
    }
    if (!gate_enter(st)) {
        fuse_reply_err(req, EBUSY);
        return;
    }
    stage_lock_drained(st);
    int fd = n->src == SRC_SPOOL ? n->fd : -1;
    pthread_mutex_unlock(&st->lock);
    int e = n->src == SRC_PACK                         ? EOPNOTSUPP
            : fd < 0                                   ? EBADF
            : fallocate(fd, mode, offset, length) == 0 ? 0
                                                       : errno;
    if (!e) {
        pthread_mutex_lock(&st->lock);
        note_uncommitted_change(st);
        pthread_mutex_unlock(&st->lock);
    }
    gate_leave(st);
    fuse_reply_err(req, e);
}
