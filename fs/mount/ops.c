/* FUSE low-level operations over an immutable tree. Everything is cached for a long time
 * (the content cannot change), READ is answered from the planner's file segments. */
#include "changed.h"
#include "common/mount_log.h"
#include "ckptfs.h"
#include "common/message.h"

#include "common/passthrough.h"

#include "core/read/dequant.h"
#include "core/read/segread.h"
#include "core/util/sha256.h"
#include "core/views/stats.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

enum { MAX_READ = 1 << 20, SEG_BATCH = 256, DIR_BLKSIZE = 4096 };

static ckptfs *fs_of(fuse_req_t req) {
    return fuse_req_userdata(req);
}

static uint32_t node_of(fuse_ino_t ino) {
    return (uint32_t)(ino - 1);
}

/* Inode = id + 1: ids above the stored nodes are .npy files (tree_node). */
static bool valid_ino(const ckptfs *fs, fuse_ino_t ino) {
    node_buf b;
    return ino >= 1 && ino - 1 < 2 * (fuse_ino_t)fs->tr.nnodes &&
           (ino - 1 < fs->tr.nnodes || tree_node(&fs->tr, node_of(ino), &b));
}

/* The statistics of every tensor (.ckptfs/stats.json), computed on first read on all CPUs and
 * kept with the per-tensor results user.ckpt.stats also answers from; the document's text is
 * not kept but rendered from them a page at a time when read (ckpt_stats_pages), so it costs
 * no more than the results. Its entries have a fixed width (ckpt_stats_pages_size_of), so a
 * stat gives its size without reading the checkpoint; it is still opened with direct_io and
 * the kernel told to ask again once built, as when sizes could change. */
static const ckpt_stats_pages *get_stats_pages(ckptfs *fs, fuse_ino_t ino) {
    pthread_mutex_lock(&fs->stats_lock);
    pthread_mutex_lock(&fs->doc_lock);
    const ckpt_stats_pages *pages = fs->stats_pages;
    pthread_mutex_unlock(&fs->doc_lock);
    if (!pages) {
        const ckpt_catalog *cat = fs->cat;
        size_t n = cat->ntensors;
        const ckpt_tensor **t = calloc(n ? n : 1, sizeof *t);
        ckpt_stats *s = calloc(n ? n : 1, sizeof *s);
        int *status = calloc(n ? n : 1, sizeof *status);
        ckpt_err *msgs = calloc(n ? n : 1, sizeof *msgs);
        for (size_t i = 0; t && i < n; i++) t[i] = &cat->tensors[i];
        bool done = t && s && status && msgs &&
                    ckpt_stats_run(cat, t, n, 0, s, status, msgs, NULL, NULL) == 0;
        pthread_mutex_lock(&fs->doc_lock);
        if (done && !fs->stats) {
            fs->stats_known = calloc(n ? n : 1, sizeof *fs->stats_known);
            if (fs->stats_known) {
                fs->stats = s;
                s = NULL;
                for (size_t i = 0; i < n; i++) fs->stats_known[i] = !status[i];
            }
        } else if (done && fs->stats_known) {
            for (size_t i = 0; i < n; i++)
                if (!status[i]) fs->stats[i] = s[i], fs->stats_known[i] = true;
        }
        /* Tensors that failed here keep their error in the document even if user.ckpt.stats
         * later computes them: the document's size never changes once given. */
        if (done && fs->stats) pages = ckpt_stats_pages_new(cat, fs->stats, status, msgs);
        fs->stats_pages = (ckpt_stats_pages *)pages;
        fs->doc_len[DOC_STATS] = pages ? (size_t)ckpt_stats_pages_size(pages) : 0;
        pthread_mutex_unlock(&fs->doc_lock);
        free(t);
        free(s);
        free(status);
        free(msgs);
        if (pages && fs->se) fuse_lowlevel_notify_inval_inode(fs->se, ino, -1, 0);
    }
    pthread_mutex_unlock(&fs->stats_lock);
    return pages;
}

/* Generated documents are built once, on first use, and kept: they are small next to the
 * tree, and building tensors.tsv of a large checkpoint is not free. */
static const char *get_doc(ckptfs *fs, size_t which, size_t *len) {
    pthread_mutex_lock(&fs->doc_lock);
    if (!fs->docs[which]) {
        switch (which) {
        case DOC_SUMMARY:
            fs->docs[which] =
                fs->alias ? ckpt_summary_json_marked(fs->cat, fs->alias, &fs->doc_len[which])
                          : ckpt_summary_json(fs->cat, &fs->doc_len[which]);
            break;
        case DOC_METADATA:
            fs->docs[which] = ckpt_metadata_json(fs->cat, &fs->doc_len[which]);
            break;
        default: /* tensors.tsv and stats.json are rendered by pages (read_pages) */
            break;
        }
    }
    const char *d = fs->docs[which];
    *len = fs->doc_len[which];
    pthread_mutex_unlock(&fs->doc_lock);
    return d;
}

/* tensors.tsv is rendered a page at a time when read (its text is 28 bytes a tensor at the
 * least): measured on first use, under doc_lock. */
static const ckpt_tsv_pages *get_tsv_pages(ckptfs *fs) {
    pthread_mutex_lock(&fs->doc_lock);
    if (!fs->tsv_pages) fs->tsv_pages = ckpt_tsv_pages_new(fs->cat);
    const ckpt_tsv_pages *p = fs->tsv_pages;
    pthread_mutex_unlock(&fs->doc_lock);
    return p;
}

/* -o as_dtype=f32 shows this tensor as F32, converted on read. */
static bool converted(const ckptfs *fs, const ckpt_tensor *t) {
    return tree_converted(&fs->tr, t);
}

/* Size of a node's content; the mount's documents are sized by generating them once (but
 * stats.json, never computed to be sized, and cache.json, live). */
static uint64_t node_size(ckptfs *fs, node *n) {
    if (n->kind != NODE_DOC) return tree_node_size(&fs->tr, n);
    size_t len;
    if (n->ref == DOC_CACHE) { /* live: the size of the counters now (read with direct I/O up
                                  to its end whatever size the kernel holds) */
        char *now = ckpt_remote_stats_json(&len);
        free(now);
        return now ? len : 0;
    }
    if (n->ref == DOC_TSV) {
        const ckpt_tsv_pages *p = get_tsv_pages(fs);
        return p ? ckpt_tsv_pages_size(p) : 0;
    }
    if (n->ref == DOC_STATS) { /* never computed to be sized: its layout gives the size */
        pthread_mutex_lock(&fs->doc_lock);
        if (!fs->doc_len[DOC_STATS])
            fs->doc_len[DOC_STATS] = (size_t)ckpt_stats_pages_size_of(fs->cat);
        len = fs->doc_len[DOC_STATS];
        pthread_mutex_unlock(&fs->doc_lock);
        return len;
    }
    return get_doc(fs, n->ref, &len) ? len : 0;
}

/* The source whose mtime a file shows: a tensor's first piece, or the file itself. */
static const ckpt_source *node_source(const ckptfs *fs, const node *n) {
    const ckpt_catalog *cat = fs->cat;
    if (n->kind == NODE_AUX) return &cat->sources[n->ref];
    if ((n->kind == NODE_TENSOR || n->kind == NODE_SIDECAR || n->kind == NODE_NPY) &&
        cat->tensors[n->ref].npieces)
        return &cat->sources[cat->tensors[n->ref].pieces[0].source];
    return NULL;
}

/* What the node adds to the checkpoint's size on disk, so that du of a mount is the checkpoint's
 * real size: .npy files and the HF view are views of tensor bytes counted already, a tied
 * tensor's bytes are its twin's, and a tensor read as F32 stores its own dtype's bytes. */
static uint64_t stored_bytes(const ckptfs *fs, const node *n, uint64_t size) {
    switch (n->kind) {
    case NODE_NPY:
        return 0;
    case NODE_VIEW:
        return fs->view_at_root ? size : 0;
    case NODE_TENSOR:
        if (fs->alias && fs->alias[n->ref]) return 0;
        return fs->cat->tensors[n->ref].nbytes;
    default:
        return size;
    }
}

static void fill_attr(ckptfs *fs, uint32_t idx, struct stat *st) {
    node_buf b;
    node *n = tree_node(&fs->tr, idx, &b);
    memset(st, 0, sizeof *st);
    st->st_ino = (ino_t)idx + 1;
    st->st_uid = fs->uid;
    st->st_gid = fs->gid;
    mode_t read_bits = tree_source_mode(&fs->tr, n) & 0444 & ~fs->umask;
    const ckpt_source *src = node_source(fs, n);
    if (n->kind == NODE_DIR) {
        st->st_mode = S_IFDIR | ((read_bits | (read_bits >> 2)) & ~fs->umask);
        st->st_nlink = 2;
        /* glibc sizes its getdents buffer from st_blksize, and the kernel allocates and vmaps a
         * buffer of that size for every READDIRPLUS: 1 MiB made a first find 5x slower. */
        st->st_blksize = DIR_BLKSIZE;
    } else {
        st->st_mode = S_IFREG | read_bits;
        st->st_nlink = 1;
        st->st_size = (off_t)node_size(fs, n);
        st->st_blocks = (off_t)(stored_bytes(fs, n, (uint64_t)st->st_size) + 511) / 512;
        st->st_blksize = MAX_READ;
    }
    struct timespec t = src ? src->mtime : fs->tr.mtime;
    st->st_mtim = st->st_ctim = st->st_atim = t;
}

/* One reusable buffer per loop thread, so READ never allocates; libfuse starts and stops
 * worker threads, so the buffers are freed by a key destructor. */
static pthread_key_t read_buf_key, bufvec_key, convert_key, gather_key;

static void make_keys(void) {
    pthread_key_create(&read_buf_key, free);
    pthread_key_create(&bufvec_key, free);
    pthread_key_create(&convert_key, free);
    pthread_key_create(&gather_key, free);
}

static void *thread_buffer(pthread_key_t key, size_t size) {
    void *p = pthread_getspecific(key);
    if (!p && (p = malloc(size))) pthread_setspecific(key, p);
    return p;
}

static void op_init(void *userdata, struct fuse_conn_info *conn) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, make_keys);
    /* INIT comes to the daemon, after it forked: reads may start worker threads now. */
    ckpt_read_workers_allow();
    ckptfs *fs = userdata;
    /* Answering OPENDIR with ENOSYS makes the kernel stop sending OPENDIR and RELEASEDIR: a
     * first `find` over a tree then costs 2 requests per directory instead of 4 (measured:
     * 24k instead of 48k requests for 12k directories). The readdir cache it gives up only
     * saved the same 2 requests on repeated listings. */
    fs->no_opendir = (conn->capable & FUSE_CAP_NO_OPENDIR_SUPPORT) != 0;
    conn->max_write = MAX_READ; /* libfuse derives the kernel's max_pages (READ size) from this */
    conn->max_readahead = MAX_READ;
    if (fs->splice && (conn->capable & FUSE_CAP_SPLICE_WRITE))
        conn->want |= FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE;
    /* READDIRPLUS for every chunk of a listing, not only its first (the kernel's "auto"): the
     * entries of a large directory after its first reply then come with their attributes, and
     * a walk does not LOOKUP them one by one (measured: 4.8k of 225k requests of a first find
     * over 100k tensors in 64 shards). */
    conn->want &= ~FUSE_CAP_READDIRPLUS_AUTO;
    /* Immutable content: mtime changes never mean the cache is stale. */
    conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
    if (conn->capable & FUSE_CAP_CACHE_SYMLINKS) conn->want |= FUSE_CAP_CACHE_SYMLINKS;
}

/* How long the kernel may keep a node's attributes: not at all for the live counters, whose
 * size changes with every request. */
static double attr_timeout(const ckptfs *fs, uint32_t idx) {
    const node *n = idx < fs->tr.nnodes ? &fs->tr.nodes[idx] : NULL;
    return n && n->kind == NODE_DOC && n->ref == DOC_CACHE ? 0.0 : fs->timeout;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
    ckptfs *fs = fs_of(req);
    struct fuse_entry_param e;
    memset(&e, 0, sizeof e);
    e.attr_timeout = e.entry_timeout = fs->timeout;
    if (!valid_ino(fs, parent)) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    uint32_t idx = tree_lookup(&fs->tr, node_of(parent), name, strlen(name));
    if (idx == UINT32_MAX) {
        fuse_reply_entry(req, &e); /* ino 0: a cached negative entry */
        return;
    }
    e.ino = idx + 1;
    e.attr_timeout = attr_timeout(fs, idx);
    fill_attr(fs, idx, &e.attr);
    fuse_reply_entry(req, &e);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)fi;
    ckptfs *fs = fs_of(req);
    if (!valid_ino(fs, ino)) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    struct stat st;
    fill_attr(fs, node_of(ino), &st);
    fuse_reply_attr(req, &st, attr_timeout(fs, node_of(ino)));
}

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
                       struct fuse_file_info *fi) {
    (void)ino, (void)attr, (void)to_set, (void)fi;
    fuse_reply_err(req, EROFS);
}

static void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    ckptfs *fs = fs_of(req);
    if (!valid_ino(fs, ino)) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    if (node_of(ino) >= fs->tr.nnodes || fs->tr.nodes[node_of(ino)].kind != NODE_DIR) {
        fuse_reply_err(req, ENOTDIR);
        return;
    }
    if (fs->no_opendir) {
        fuse_reply_err(req, ENOSYS);
        return;
    }
    fi->cache_readdir = 1;
    fi->keep_cache = 1;
    fuse_reply_open(req, fi);
}

/* Directory offsets: 1 = after ".", 2 = after "..", 3 + 2k = after child k, 4 + 2k = after the
 * .npy beside child k (which comes right after it: NAME.json, NAME.npy keep the name order). */
static void readdir_common(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus) {
    ckptfs *fs = fs_of(req);
    const tree *tr = &fs->tr;
    if (node_of(ino) >= tr->nnodes || tr->nodes[node_of(ino)].kind != NODE_DIR) {
        fuse_reply_err(req, ENOTDIR);
        return;
    }
    const node *dir = &tr->nodes[node_of(ino)];
    char *buf = malloc(size);
    if (!buf) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    size_t used = 0;
    for (off_t k = off < 0 ? 0 : off; k < 2 + 2 * (off_t)dir->nchildren; k++) {
        uint32_t idx;
        const char *name;
        char tmp[256];
        node_buf b;
        if (k == 0) {
            idx = node_of(ino);
            name = ".";
        } else if (k == 1) {
            idx = dir->parent;
            name = "..";
        } else {
            idx = tr->children[dir->first_child + (size_t)(k - 2) / 2];
            if ((k - 2) % 2) {
                if (!tree_has_npy(tr, idx)) continue;
                idx += (uint32_t)tr->nnodes;
            }
            const node *c = tree_node(tr, idx, &b);
            memcpy(tmp, c->name, c->name_len);
            tmp[c->name_len] = '\0';
            name = tmp;
        }
        size_t n;
        if (plus) {
            struct fuse_entry_param e;
            memset(&e, 0, sizeof e);
            e.ino = idx + 1;
            e.entry_timeout = fs->timeout;
            e.attr_timeout = attr_timeout(fs, idx);
            fill_attr(fs, idx, &e.attr);
            n = fuse_add_direntry_plus(req, buf + used, size - used, name, &e, k + 1);
        } else {
            struct stat st;
            memset(&st, 0, sizeof st);
            st.st_ino = idx + 1;
            st.st_mode = idx < tr->nnodes && tr->nodes[idx].kind == NODE_DIR ? S_IFDIR : S_IFREG;
            n = fuse_add_direntry(req, buf + used, size - used, name, &st, k + 1);
        }
        if (n > size - used) break;
        used += n;
    }
    fuse_reply_buf(req, buf, used);
    free(buf);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                       struct fuse_file_info *fi) {
    (void)fi;
    readdir_common(req, ino, size, off, false);
}

static void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                           struct fuse_file_info *fi) {
    (void)fi;
    readdir_common(req, ino, size, off, true);
}

/* Why an open fails with EIO, once per source, to the mount's log: the sources of n that are
 * no longer what the catalog read. */
static void note_stale(const ckptfs *fs, const node *n) {
    const ckpt_catalog *cat = fs->cat;
    const tree *tr = &fs->tr;
    if (n->kind == NODE_AUX) {
        if (!ckpt_source_current(&cat->sources[n->ref])) changed_note(&cat->sources[n->ref]);
    } else if (n->kind == NODE_VIEW) {
        for (uint32_t i = tr->view_src_first[n->ref]; i < tr->view_src_first[n->ref + 1]; i++)
            if (!ckpt_source_current(&cat->sources[tr->view_srcs[i]]))
                changed_note(&cat->sources[tr->view_srcs[i]]);
    } else if (n->kind == NODE_TENSOR || n->kind == NODE_SIDECAR || n->kind == NODE_NPY) {
        const ckpt_tensor *t = &cat->tensors[n->ref];
        for (uint32_t k = 0; k < t->npieces; k++)
            if (!ckpt_source_current(&cat->sources[t->pieces[k].source]))
                changed_note(&cat->sources[t->pieces[k].source]);
    }
}

/* Sidecars are generated per open; the list lets shutdown free those whose RELEASE never
 * came (files still open at unmount). */
static void track_open_doc(ckptfs *fs, open_doc *d) {
    pthread_mutex_lock(&fs->doc_lock);
    d->next = fs->open_docs;
    d->prev = &fs->open_docs;
    if (d->next) d->next->prev = &d->next;
    fs->open_docs = d;
    pthread_mutex_unlock(&fs->doc_lock);
}

void ckptfs_free_open_docs(ckptfs *fs) {
    while (fs->open_docs) {
        open_doc *d = fs->open_docs;
        fs->open_docs = d->next;
        ckpt_vfile_free(&d->vf);
        free(d->text);
        free(d);
    }
}

/* The backing id to open n on in passthrough mode, 0 for the daemon path, or -EIO: n must be
 * one source's whole file (tree_node_whole_source), registered once per source from a
 * descriptor of the very file the catalog read (ckpt_source_open_again). The kernel will read
 * that file without asking, so it must be unchanged now, or the open fails: a view file's open
 * otherwise only asks that its sources were not replaced, and leaves the check of bytes
 * changed in place to its reads, which passthrough skips. */
static int backing_of(ckptfs *fs, node *n) {
    if (!fs->passthrough || !fs->backing || passthrough_refused()) return 0;
    uint32_t src = tree_node_whole_source(&fs->tr, n);
    if (src == UINT32_MAX) return 0;
    if (!ckpt_source_current(&fs->cat->sources[src])) {
        changed_note(&fs->cat->sources[src]);
        return -EIO;
    }
    pthread_mutex_lock(&fs->backing_lock);
    int id = fs->backing[src];
    if (id == 0) {
        int fd = ckpt_source_open_again(&fs->cat->sources[src]);
        id = fd < 0 ? fd : passthrough_backing_open(fd);
        if (fd >= 0) close(fd); /* the kernel holds its own reference */
        fs->backing[src] = id < 0 ? -1 : id;
    }
    pthread_mutex_unlock(&fs->backing_lock);
    return id > 0 ? id : 0;
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    ckptfs *fs = fs_of(req);
    if (!valid_ino(fs, ino)) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC)) {
        fuse_reply_err(req, EROFS);
        return;
    }
    node_buf b;
    node *n = tree_node(&fs->tr, node_of(ino), &b);
    const ckpt_catalog *cat = fs->cat;
    fi->fh = 0;
    /* A source changed or replaced since the mount gives EIO from here on, never other bytes:
     * reads check in place changes, but a descriptor of a replaced file still reads the old.
     * A view file fails only the reads of a changed source's ranges (by_range). */
    if (!tree_node_current(&fs->tr, n, true)) {
        note_stale(fs, n);
        fuse_reply_err(req, EIO);
        return;
    }
    switch (n->kind) {
    case NODE_DIR:
        fuse_reply_err(req, EISDIR);
        return;
    case NODE_TENSOR:
    case NODE_AUX:
    case NODE_VIEW:
        break;
    case NODE_SIDECAR:
    case NODE_NPY: {
        const ckpt_tensor *t = &cat->tensors[n->ref];
        open_doc *d = calloc(1, sizeof *d);
        if (d && n->kind == NODE_SIDECAR) d->text = tree_sidecar_text(&fs->tr, n, &d->len);
        /* a converted tensor's data is read by read_converted_npy, not planned */
        if (d && n->kind == NODE_NPY && (d->text = tree_npy_header(&fs->tr, t, &d->len)) &&
            !converted(fs, t) &&
            (ckpt_vfile_add_mem(&d->vf, d->text, d->len) ||
             ckpt_vfile_add_tensor(&d->vf, t, 0, t->nbytes))) {
            ckpt_vfile_free(&d->vf);
            free(d->text);
            d->text = NULL;
        }
        if (!d || !d->text) {
            free(d);
            fuse_reply_err(req, ENOMEM);
            return;
        }
        track_open_doc(fs, d);
        fi->fh = (uintptr_t)d;
        break;
    }
    case NODE_DOC:
        if (n->ref == DOC_CACHE) {
            /* A snapshot of the counters per open, never cached by the kernel. */
            open_doc *d = calloc(1, sizeof *d);
            if (!d || !(d->text = ckpt_remote_stats_json(&d->len))) {
                free(d);
                fuse_reply_err(req, ENOMEM);
                return;
            }
            track_open_doc(fs, d);
            fi->fh = (uintptr_t)d;
            fi->direct_io = 1;
            fuse_reply_open(req, fi);
            return;
        }
        if (n->ref == DOC_STATS) {
            fi->direct_io = 1;
            fuse_reply_open(req, fi);
            return;
        }
        break;
    }
    int backing = fi->fh ? 0 : backing_of(fs, n); /* a file of an open handle is made here */
    if (backing < 0) {
        fuse_reply_err(req, -backing);
        return;
    }
    if (backing > 0) {
        passthrough_next_open(backing); /* the kernel reads and maps the source itself */
    } else {
        fi->keep_cache = 1;
    }
    fuse_reply_open(req, fi);
}

static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)ino;
    open_doc *d = (open_doc *)(uintptr_t)fi->fh;
    if (d) {
        pthread_mutex_lock(&fs_of(req)->doc_lock);
        *d->prev = d->next;
        if (d->next) d->next->prev = d->prev;
        pthread_mutex_unlock(&fs_of(req)->doc_lock);
        ckpt_vfile_free(&d->vf);
        free(d->text);
        free(d);
    }
    fuse_reply_err(req, 0);
}

/* What a READ of n reads: the text the open handle or the mount holds for generated files,
 * else the catalog's bytes (tree_plan). */
static size_t plan_read(ckptfs *fs, const node *n, struct fuse_file_info *fi, uint64_t off,
                        uint64_t len, ckpt_segment *seg, size_t cap, uint64_t *done) {
    const open_doc *d = fi ? (const open_doc *)(uintptr_t)fi->fh : NULL;
    size_t mem_len = 0;
    const char *mem;
    switch (n->kind) {
    case NODE_SIDECAR:
        return tree_plan_text(d->text, d->len, off, len, seg, cap, done);
    case NODE_NPY:
        return ckpt_vfile_plan(&d->vf, off, len, seg, cap, done);
    case NODE_DOC:
        if (n->ref == DOC_CACHE && d)
            return tree_plan_text(d->text, d->len, off, len, seg, cap, done);
        *done = 0;
        if (n->ref == DOC_STATS || n->ref == DOC_TSV) return 0; /* read_pages */
        mem = get_doc(fs, n->ref, &mem_len);
        return tree_plan_text(mem, mem_len, off, len, seg, cap, done);
    default:
        return tree_plan(&fs->tr, n, off, len, seg, cap, done);
    }
}

/* Planned segments into dst; fragments of one source read together through a per-thread
 * scratch window (core/read/segread.c). 0 or a positive errno. */
static int read_segments(const ckptfs *fs, const ckpt_segment *seg, size_t n, char *dst) {
    char *scratch = thread_buffer(gather_key, SEGREAD_SCRATCH);
    int e = -ckpt_read_segments(fs->cat, seg, n, dst, scratch); /* core's errno is negative */
    for (size_t i = 0; e == EIO && i < n; i++)                  /* which source, for the log */
        if (seg[i].kind == CKPT_SEG_FILE &&
            !ckpt_source_unchanged(&fs->cat->sources[seg[i].source]))
            changed_note(&fs->cat->sources[seg[i].source]);
    return e;
}

/* The kernel can splice only bytes that lie in a local file as they are (ckpt_source_file_extent):
 * not those of a .zst or a remote source, nor the elements of a strided piece. */
static bool spliceable(const ckptfs *fs, const ckpt_segment *seg, size_t n) {
    uint64_t at;
    for (size_t i = 0; i < n; i++)
        if (seg[i].kind == CKPT_SEG_STRIDED ||
            (seg[i].kind == CKPT_SEG_FILE &&
             !ckpt_source_file_extent(&fs->cat->sources[seg[i].source], seg[i].offset,
                                      seg[i].length, &at)))
            return false;
    return true;
}

/* The splice checks the sources before the kernel moves their pages, which a write can still
 * change on the way: the check after the reply is the exact one (a write updates mtime and
 * ctime before it touches the page cache), but it comes too late for this reply. A source it
 * finds changed is marked so every later read gives EIO, the kernel's cache of this file (which
 * may hold the mixed reply) is dropped, and the daemon says so on stderr. */
static void check_after_splice(ckptfs *fs, fuse_ino_t ino, const ckpt_segment *seg, size_t n) {
    bool dropped = false;
    for (size_t i = 0; i < n; i++) {
        if (seg[i].kind != CKPT_SEG_FILE) continue;
        const ckpt_source *s = &fs->cat->sources[seg[i].source];
        if (ckpt_source_unchanged(s)) continue;
        if (ckpt_source_mark_changed(s))
            mount_log("%s changed while a spliced reply was read from it (-o splice): that "
                      "reply may hold new bytes; every later read of it gives EIO",
                      s->path);
        if (!dropped && fs->se) fuse_lowlevel_notify_inval_inode(fs->se, ino, 0, 0);
        dropped = true;
    }
}

static void reply_splice(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, const ckpt_segment *seg,
                         size_t n) {
    /* fuse_bufvec ends in a one-element array: room for SEG_BATCH buffers, kept per thread. */
    struct fuse_bufvec *vec =
        thread_buffer(bufvec_key, sizeof *vec + SEG_BATCH * sizeof(struct fuse_buf));
    if (!vec) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    memset(vec, 0, sizeof *vec);
    vec->count = n;
    struct fuse_buf *bufs = &vec->buf[0];
    for (size_t i = 0; i < n; i++) {
        struct fuse_buf *fb = bufs + i;
        memset(fb, 0, sizeof *fb);
        fb->size = seg[i].length;
        if (seg[i].kind == CKPT_SEG_MEM) {
            fb->mem = (void *)seg[i].mem;
            continue;
        }
        /* A spliced short read would reach the reader as zeros: check the source first. */
        if (!ckpt_source_unchanged(&fs->cat->sources[seg[i].source])) {
            fuse_reply_err(req, EIO);
            return;
        }
        const ckpt_source *s = &fs->cat->sources[seg[i].source];
        uint64_t at = 0;
        ckpt_source_file_extent(s, seg[i].offset, seg[i].length, &at); /* spliceable said so */
        fb->flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK | FUSE_BUF_FD_RETRY;
        fb->fd = s->fd;
        fb->pos = (off_t)at;
    }
    fuse_reply_data(req, vec, FUSE_BUF_SPLICE_MOVE);
    check_after_splice(fs, ino, seg, n);
}

/* F32 bytes [off, off+size) of a narrower or block-quantized tensor (off inside it, size cut to
 * its end): the whole blocks that hold them are read and converted; *out points at the slice
 * in the thread's scratch. 0 or a positive errno. */
static int convert_range(ckptfs *fs, const ckpt_tensor *t, uint64_t off, size_t size,
                         const char **out_slice);

static void read_converted(fuse_req_t req, ckptfs *fs, const ckpt_tensor *t, uint64_t off,
                           size_t size) {
    uint64_t total = t->numel * 4;
    if (off >= total) {
        fuse_reply_buf(req, NULL, 0);
        return;
    }
    if (size > total - off) size = (size_t)(total - off);
    const char *slice;
    int e = convert_range(fs, t, off, size, &slice);
    if (e)
        fuse_reply_err(req, e);
    else
        fuse_reply_buf(req, slice, size);
}

/* The .npy of a tensor read as F32: its header (kept with the open file), then the converted
 * bytes; a read that spans both is put together in the read buffer. */
static void read_converted_npy(fuse_req_t req, ckptfs *fs, const ckpt_tensor *t, const open_doc *d,
                               uint64_t off, size_t size) {
    if (off >= d->len) {
        read_converted(req, fs, t, off - d->len, size);
        return;
    }
    uint64_t total = d->len + t->numel * 4;
    if (size > total - off) size = (size_t)(total - off);
    char *buf = thread_buffer(read_buf_key, MAX_READ);
    if (!buf) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    size_t head = d->len - (size_t)off < size ? d->len - (size_t)off : size;
    memcpy(buf, d->text + off, head);
    if (size > head) {
        const char *slice;
        int e = convert_range(fs, t, 0, size - head, &slice);
        if (e) {
            fuse_reply_err(req, e);
            return;
        }
        memcpy(buf + head, slice, size - head);
    }
    fuse_reply_buf(req, buf, size);
}

static int convert_range(ckptfs *fs, const ckpt_tensor *t, uint64_t off, size_t size,
                         const char **out_slice) {
    const ckpt_dtype_info *info = ckpt_dtype_info_of(t->dtype);
    uint64_t first = off / 4 / info->block;
    uint64_t last = ((off + size + 3) / 4 + info->block - 1) / info->block;
    size_t nblocks = (size_t)(last - first);
    size_t src_len = nblocks * info->block_bytes, out_len = nblocks * info->block * 4;
    /* At most 1 MiB of output plus a partial block at each end. */
    enum { SCRATCH = 2 * MAX_READ + 64 * 1024 };
    char *scratch = thread_buffer(convert_key, SCRATCH);
    if (!scratch || src_len + out_len > SCRATCH) return scratch ? EIO : ENOMEM;
    float *out = (float *)(void *)scratch;
    unsigned char *src = (unsigned char *)scratch + out_len;
    uint64_t at = first * info->block_bytes, got = 0;
    while (got < src_len) {
        ckpt_segment seg[SEG_BATCH];
        uint64_t done;
        size_t nseg = ckpt_plan(t, at + got, src_len - got, seg, SEG_BATCH, &done);
        if (nseg == 0) return EIO;
        int e = read_segments(fs, seg, nseg, (char *)src + got);
        if (e) return e;
        got += done; /* what the planner says the segments cover */
    }
    ckpt_to_f32(t->dtype, src, nblocks, out);
    *out_slice = (const char *)out + (off - first * info->block * 4);
    return 0;
}

/* Bytes of remote sources go to the kernel straight from the block cache: one copy of them
 * fewer than reading them into a buffer first (a fifth of the daemon's time in a sequential
 * read). False when these segments cannot be shown that way: the caller reads them. */
static bool reply_view(fuse_req_t req, const ckptfs *fs, const ckpt_segment *seg, size_t n) {
    ckpt_view v = {.n = 0};
    bool ok = n <= CKPT_VIEW_MAX;
    for (size_t i = 0; ok && i < n; i++)
        ok = seg[i].kind == CKPT_SEG_FILE && ckpt_source_view(&fs->cat->sources[seg[i].source],
                                                              seg[i].offset, seg[i].length, &v) > 0;
    if (ok) {
        struct iovec iov[CKPT_VIEW_MAX];
        for (size_t i = 0; i < v.n; i++) iov[i] = (struct iovec){(void *)v.base[i], v.len[i]};
        fuse_reply_iov(req, iov, (int)v.n);
    }
    ckpt_view_release(&v);
    return ok;
}

/* stats.json and tensors.tsv: rendered from the page that holds off. */
static void read_pages(fuse_req_t req, ckptfs *fs, fuse_ino_t ino, size_t size, off_t off,
                       bool tsv) {
    const ckpt_stats_pages *stats = tsv ? NULL : get_stats_pages(fs, ino);
    const ckpt_tsv_pages *lines = tsv ? get_tsv_pages(fs) : NULL;
    char *read_buf = thread_buffer(read_buf_key, MAX_READ);
    if ((!stats && !lines) || !read_buf) {
        fuse_reply_err(req, !read_buf || tsv ? ENOMEM : EIO); /* stats: a failed run */
        return;
    }
    ssize_t got = tsv ? ckpt_tsv_pages_read(lines, (uint64_t)off, read_buf, size)
                      : ckpt_stats_pages_read(stats, (uint64_t)off, read_buf, size);
    if (got < 0)
        fuse_reply_err(req, (int)-got);
    else
        fuse_reply_buf(req, read_buf, (size_t)got);
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                    struct fuse_file_info *fi) {
    ckptfs *fs = fs_of(req);
    node_buf b;
    const node *n = valid_ino(fs, ino) ? tree_node(&fs->tr, node_of(ino), &b) : NULL;
    if (!n) {
        fuse_reply_err(req, EBADF);
        return;
    }
    if (size > MAX_READ) size = MAX_READ;
    if (n->kind == NODE_DOC && (n->ref == DOC_STATS || n->ref == DOC_TSV)) {
        read_pages(req, fs, ino, size, off, n->ref == DOC_TSV);
        return;
    }
    if (n->kind == NODE_TENSOR && converted(fs, &fs->cat->tensors[n->ref])) {
        read_converted(req, fs, &fs->cat->tensors[n->ref], (uint64_t)off, size);
        return;
    }
    if (n->kind == NODE_NPY && converted(fs, &fs->cat->tensors[n->ref]) && fi && fi->fh) {
        read_converted_npy(req, fs, &fs->cat->tensors[n->ref], (const open_doc *)(uintptr_t)fi->fh,
                           (uint64_t)off, size);
        return;
    }
    ckpt_segment seg[SEG_BATCH];
    uint64_t done;
    size_t nseg = plan_read(fs, n, fi, (uint64_t)off, size, seg, SEG_BATCH, &done);
    if (nseg == 0) {
        fuse_reply_buf(req, NULL, 0);
        return;
    }
    bool holes = false;
    for (size_t i = 0; i < nseg; i++) holes |= seg[i].kind == CKPT_SEG_HOLE;
    if (holes) {
        fuse_reply_err(req, EIO);
        return;
    }
    if (done == size && seg[0].kind == CKPT_SEG_FILE && reply_view(req, fs, seg, nseg)) return;
    /* Splice pays off only for whole requests served by file segments of a page or more. */
    if (fs->splice && done == size && nseg <= SEG_BATCH && seg[0].length >= 4096 &&
        spliceable(fs, seg, nseg)) {
        reply_splice(req, fs, ino, seg, nseg);
        return;
    }
    char *read_buf = thread_buffer(read_buf_key, MAX_READ);
    if (!read_buf) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    size_t filled = 0;
    for (;;) {
        int e = read_segments(fs, seg, nseg, read_buf + filled);
        if (e) {
            fuse_reply_err(req, e);
            return;
        }
        filled += done;
        if (filled >= size || done == 0) break;
        nseg = plan_read(fs, n, fi, (uint64_t)off + filled, size - filled, seg, SEG_BATCH, &done);
        if (nseg == 0) break;
        for (size_t i = 0; i < nseg; i++)
            if (seg[i].kind == CKPT_SEG_HOLE) {
                fuse_reply_err(req, EIO);
                return;
            }
    }
    fuse_reply_buf(req, read_buf, filled);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino) {
    (void)ino;
    ckptfs *fs = fs_of(req);
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < fs->cat->nsources; i++) bytes += fs->cat->sources[i].size;
    struct statvfs sv;
    memset(&sv, 0, sizeof sv);
    sv.f_bsize = sv.f_frsize = 4096;
    sv.f_blocks = (bytes + 4095) / 4096;
    sv.f_files = fs->tr.nnodes + fs->tr.nnpy;
    sv.f_namemax = 255;
    sv.f_flag = ST_RDONLY;
    fuse_reply_statfs(req, &sv);
}

/* ---- extended attributes on tensor files: user.ckpt.dtype, .shape, .sha256 ---- */

/* The names a tensor file has: no sha256 for a converted tensor (no stored-bytes digest to
 * offer), no stats for a dtype whose values are not decoded. */
static size_t xattr_list(const ckptfs *fs, const ckpt_tensor *t, char *out) {
    static const char *const all[] = {"user.ckpt.dtype", "user.ckpt.shape", "user.ckpt.sha256",
                                      "user.ckpt.stats"};
    size_t len = 0;
    for (size_t i = 0; i < 4; i++) {
        if (i == 2 && converted(fs, t)) continue;
        if (i == 3 && !ckpt_stats_supported(t->dtype)) continue;
        memcpy(out + len, all[i], strlen(all[i]) + 1);
        len += strlen(all[i]) + 1;
    }
    return len;
}

/* The statistics of one tensor, computed (on all CPUs) on first request and kept. */
static int tensor_stats(ckptfs *fs, size_t ti, ckpt_stats *out) {
    pthread_mutex_lock(&fs->doc_lock);
    if (!fs->stats) {
        size_t n = fs->cat->ntensors ? fs->cat->ntensors : 1;
        fs->stats = calloc(n, sizeof *fs->stats);
        fs->stats_known = calloc(n, sizeof *fs->stats_known);
    }
    bool ready = fs->stats && fs->stats_known;
    bool known = ready && fs->stats_known[ti];
    if (known) *out = fs->stats[ti];
    pthread_mutex_unlock(&fs->doc_lock);
    if (known) return 0;
    if (!ready) return ENOMEM;
    const ckpt_tensor *t = &fs->cat->tensors[ti];
    int status = 0;
    ckpt_err msg;
    pthread_mutex_lock(&fs->stats_lock);
    int rc = ckpt_stats_run(fs->cat, &t, 1, 0, out, &status, &msg, NULL, NULL);
    pthread_mutex_unlock(&fs->stats_lock);
    if (rc || status) return rc ? -rc : status == -ENOTSUP ? ENODATA : -status;
    pthread_mutex_lock(&fs->doc_lock);
    fs->stats[ti] = *out;
    fs->stats_known[ti] = true;
    pthread_mutex_unlock(&fs->doc_lock);
    return 0;
}

/* The digest of the bytes the file shows, computed on first request and kept. */
static int tensor_sha256(ckptfs *fs, size_t ti, unsigned char out[32]) {
    pthread_mutex_lock(&fs->doc_lock);
    if (!fs->sha256) fs->sha256 = calloc(fs->cat->ntensors ? fs->cat->ntensors : 1, 33);
    bool known = fs->sha256 && fs->sha256[ti][0];
    if (known) memcpy(out, fs->sha256[ti] + 1, 32);
    pthread_mutex_unlock(&fs->doc_lock);
    if (known) return 0;
    if (!fs->sha256) return ENOMEM;
    const ckpt_tensor *t = &fs->cat->tensors[ti];
    char *buf = malloc(MAX_READ);
    if (!buf) return ENOMEM;
    sha256_ctx ctx;
    sha256_init(&ctx);
    int e = 0;
    for (uint64_t off = 0; off < t->nbytes && !e;) {
        ckpt_segment seg[SEG_BATCH];
        uint64_t done, want = t->nbytes - off < MAX_READ ? t->nbytes - off : MAX_READ;
        size_t n = ckpt_plan(t, off, want, seg, SEG_BATCH, &done);
        size_t filled = (size_t)done;
        e = n ? read_segments(fs, seg, n, buf) : EIO;
        sha256_update(&ctx, buf, filled);
        off += done;
    }
    free(buf);
    if (e) return e;
    sha256_final(&ctx, out);
    pthread_mutex_lock(&fs->doc_lock);
    memcpy(fs->sha256[ti] + 1, out, 32);
    fs->sha256[ti][0] = 1;
    pthread_mutex_unlock(&fs->doc_lock);
    return 0;
}

static void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size) {
    ckptfs *fs = fs_of(req);
    const node *n =
        valid_ino(fs, ino) && node_of(ino) < fs->tr.nnodes ? &fs->tr.nodes[node_of(ino)] : NULL;
    if (!n || n->kind != NODE_TENSOR) {
        fuse_reply_err(req, ENODATA);
        return;
    }
    const ckpt_tensor *t = &fs->cat->tensors[n->ref];
    bool conv = converted(fs, t);
    char value[CKPT_MAX_DIMS * 22 + CKPT_STATS_JSON_MAX];
    size_t len = 0;
    if (strcmp(name, "user.ckpt.dtype") == 0) {
        len = (size_t)snprintf(value, sizeof value, "%s",
                               ckpt_dtype_info_of(conv ? CKPT_F32 : t->dtype)->name);
    } else if (strcmp(name, "user.ckpt.shape") == 0) {
        len = 1;
        value[0] = '[';
        for (uint32_t d = 0; d < t->ndim; d++)
            len += (size_t)snprintf(value + len, sizeof value - len, "%s%llu", d ? "," : "",
                                    (unsigned long long)t->shape[d]);
        value[len++] = ']';
    } else if (strcmp(name, "user.ckpt.sha256") == 0 && !conv) {
        unsigned char digest[32];
        int e = tensor_sha256(fs, n->ref, digest);
        if (e) {
            fuse_reply_err(req, e);
            return;
        }
        sha256_hex(digest, value);
        len = 64;
    } else if (strcmp(name, "user.ckpt.stats") == 0 && ckpt_stats_supported(t->dtype)) {
        ckpt_stats s;
        int e = tensor_stats(fs, n->ref, &s);
        if (e) {
            fuse_reply_err(req, e);
            return;
        }
        value[0] = '{';
        len = 1 + ckpt_stats_json_members(&s, value + 1);
        value[len++] = '}';
    } else {
        fuse_reply_err(req, ENODATA);
        return;
    }
    if (size == 0)
        fuse_reply_xattr(req, len);
    else if (size < len)
        fuse_reply_err(req, ERANGE);
    else
        fuse_reply_buf(req, value, len);
}

static void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
    ckptfs *fs = fs_of(req);
    const node *n =
        valid_ino(fs, ino) && node_of(ino) < fs->tr.nnodes ? &fs->tr.nodes[node_of(ino)] : NULL;
    char names[128];
    size_t len = n && n->kind == NODE_TENSOR ? xattr_list(fs, &fs->cat->tensors[n->ref], names) : 0;
    if (size == 0)
        fuse_reply_xattr(req, len);
    else if (size < len)
        fuse_reply_err(req, ERANGE);
    else
        fuse_reply_buf(req, names, len);
}

static void op_access(fuse_req_t req, fuse_ino_t ino, int mask) {
    (void)ino;
    fuse_reply_err(req, (mask & W_OK) ? EROFS : 0);
}

const struct fuse_lowlevel_ops ckptfs_ops = {
    .init = op_init,
    .lookup = op_lookup,
    .getattr = op_getattr,
    .setattr = op_setattr,
    .opendir = op_opendir,
    .readdir = op_readdir,
    .readdirplus = op_readdirplus,
    .open = op_open,
    .read = op_read,
    .release = op_release,
    .statfs = op_statfs,
    .access = op_access,
    .getxattr = op_getxattr,
    .listxattr = op_listxattr,
};
