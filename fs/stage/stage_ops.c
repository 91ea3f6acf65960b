/* FUSE operations of the staging mount on names and attributes (file contents: stage_io.c).
 * Every change goes to the spool's journal before it is answered. Renaming or removing a file
 * of the source costs nothing: only the tree and the journal change.
 *
 * Inode numbers are node addresses (the root is FUSE_ROOT_ID); a node that was removed lives
 * on until the kernel forgets it and its last handle is closed. */
#include "stage_ops.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* ---- attributes ---- */

static void fill_attr(stage *st, snode *n, struct stat *s) {
    memset(s, 0, sizeof *s);
    s->st_ino = ino_of(st, n);
    s->st_uid = st->uid;
    s->st_gid = st->gid;
    s->st_blksize = MAX_IO;
    s->st_mtim = s->st_ctim = s->st_atim = n->mtime;
    switch (n->kind) {
    case SN_DIR:
    case SN_CONTROL_DIR:
        s->st_mode = S_IFDIR | (n->kind == SN_DIR ? n->mode : 0755);
        s->st_nlink = 2;
        return;
    case SN_COMMIT:
        s->st_mode = S_IFREG | 0644;
        s->st_nlink = 1;
        return;
    case SN_STATUS:
        s->st_mode = S_IFREG | 0444;
        s->st_nlink = 1;
        return;
    case SN_FILE:
        break;
    }
    s->st_mode = S_IFREG | n->mode;
    s->st_nlink = n->removed ? 0 : 1;
    if (n->src == SRC_PACK) {
        s->st_size = (off_t)n->pack_size;
        s->st_blocks = (s->st_size + 511) / 512;
        return;
    }
    if (n->src != SRC_SPOOL) {
        s->st_size = (off_t)n->lower_size;
        s->st_blocks = (s->st_size + 511) / 512;
        return;
    }
    struct stat d;
    if ((n->fd >= 0 ? fstat(n->fd, &d) : spool_data_stat(st, n->data_id, &d)) == 0) {
        s->st_size = d.st_size;
        s->st_blocks = d.st_blocks;
        s->st_mtim = d.st_mtim;
        s->st_ctim = d.st_ctim;
        s->st_atim = d.st_atim;
    }
}

static double timeout_of(const stage *st, const snode *n) {
    return is_control(n) ? 0 : st->timeout; /* the status changes by itself */
}

/* Answers with an entry for n; the kernel now holds one more reference. Under st->lock. */
static void reply_entry(fuse_req_t req, stage *st, snode *n) {
    struct fuse_entry_param e;
    memset(&e, 0, sizeof e);
    e.ino = ino_of(st, n);
    e.attr_timeout = e.entry_timeout = timeout_of(st, n);
    fill_attr(st, n, &e.attr);
    if (n != st->root && !is_control(n)) n->nlookup++;
    fuse_reply_entry(req, &e);
}

/* ---- names ---- */

/* May `name` be created in or removed from dir? 0 or a positive errno. */
static int check_dir(stage *st, snode *dir, const char *name) {
    if (dir->kind == SN_CONTROL_DIR) return EPERM;
    if (dir->kind != SN_DIR) return ENOTDIR;
    if (strlen(name) > NAME_MAX_BYTES) return ENAMETOOLONG;
    if (dir == st->root && strcmp(name, CONTROL_NAME) == 0) return EPERM;
    return 0;
}

static void touch(snode *dir) {
    clock_gettime(CLOCK_REALTIME, &dir->mtime);
}

/* ---- operations ---- */

static void op_init(void *userdata, struct fuse_conn_info *conn) {
    (void)userdata;
    conn->max_write = MAX_IO;
    conn->max_readahead = MAX_IO;
    /* Writes go straight to the spool: no write-back cache to lose in a crash, and sizes the
     * kernel cannot get wrong. */
    conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
    if (conn->capable & FUSE_CAP_ATOMIC_O_TRUNC) conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
    stage *st = st_of(req);
    pthread_mutex_lock(&st->lock);
    snode *p = node_of(st, parent), *c = NULL;
    int e = ENOENT;
    if (p == st->root && strcmp(name, CONTROL_NAME) == 0) {
        c = &st->control;
    } else if (p->kind == SN_CONTROL_DIR) {
        c = strcmp(name, "commit") == 0   ? &st->commit_node
            : strcmp(name, "status") == 0 ? &st->status_node
                                          : NULL;
    } else if (p->kind != SN_DIR) {
        e = ENOTDIR;
    } else {
        c = tree_child(p, name, strlen(name));
    }
    if (c)
        reply_entry(req, st, c);
    else
        fuse_reply_err(req, e);
    pthread_mutex_unlock(&st->lock);
}

static void forget_one(stage *st, fuse_ino_t ino, uint64_t nlookup) {
    snode *n = node_of(st, ino);
    if (n == st->root || is_control(n)) return;
    n->nlookup = n->nlookup > nlookup ? n->nlookup - nlookup : 0;
    tree_release_if_unused(n);
}

static void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
    stage *st = st_of(req);
    pthread_mutex_lock(&st->lock);
    forget_one(st, ino, nlookup);
    pthread_mutex_unlock(&st->lock);
    fuse_reply_none(req);
}

static void op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets) {
    stage *st = st_of(req);
    pthread_mutex_lock(&st->lock);
    for (size_t i = 0; i < count; i++) forget_one(st, forgets[i].ino, forgets[i].nlookup);
    pthread_mutex_unlock(&st->lock);
    fuse_reply_none(req);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)fi;
    stage *st = st_of(req);
    struct stat s;
    pthread_mutex_lock(&st->lock);
    snode *n = node_of(st, ino);
    fill_attr(st, n, &s);
    double t = timeout_of(st, n);
    pthread_mutex_unlock(&st->lock);
    fuse_reply_attr(req, &s, t);
}

static int set_times(stage *st, snode *n, const struct stat *attr, int to_set) {
    struct timespec ts[2] = {{.tv_nsec = UTIME_OMIT}, {.tv_nsec = UTIME_OMIT}};
    if (to_set & FUSE_SET_ATTR_ATIME) ts[0] = attr->st_atim;
    if (to_set & FUSE_SET_ATTR_ATIME_NOW) ts[0].tv_nsec = UTIME_NOW;
    if (to_set & FUSE_SET_ATTR_MTIME) ts[1] = attr->st_mtim;
    if (to_set & FUSE_SET_ATTR_MTIME_NOW) ts[1].tv_nsec = UTIME_NOW;
    if (n->kind == SN_FILE && n->src == SRC_SPOOL) {
        char name[17];
        spool_data_name(n->data_id, name);
        return utimensat(st->data_fd, name, ts, 0) == 0 ? 0 : errno;
    }
    if (ts[1].tv_nsec == UTIME_NOW)
        clock_gettime(CLOCK_REALTIME, &n->mtime);
    else if (ts[1].tv_nsec != UTIME_OMIT)
        n->mtime = ts[1];
    return 0;
}

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
                       struct fuse_file_info *fi) {
    (void)fi;
    stage *st = st_of(req);
    snode *n = node_of(st, ino);
    struct stat s;
    if (is_control(n)) {
        /* `echo > .ckptfs/commit` truncates first: harmless, nothing to change. */
        if (to_set & (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)) {
            fuse_reply_err(req, EPERM);
            return;
        }
        pthread_mutex_lock(&st->lock);
        fill_attr(st, n, &s);
        pthread_mutex_unlock(&st->lock);
        fuse_reply_attr(req, &s, 0);
        return;
    }
    if (((to_set & FUSE_SET_ATTR_UID) && attr->st_uid != st->uid) ||
        ((to_set & FUSE_SET_ATTR_GID) && attr->st_gid != st->gid)) {
        fuse_reply_err(req, EPERM); /* every file belongs to whoever runs the stage */
        return;
    }
    if (!gate_enter(st)) {
        fuse_reply_err(req, EBUSY);
        return;
    }
    if (to_set & FUSE_SET_ATTR_SIZE)
        stage_lock_drained(st); /* no write answered before lands past the new end */
    else
        pthread_mutex_lock(&st->lock);
    int e = 0;
    if (to_set & FUSE_SET_ATTR_SIZE) e = stage_set_size(st, n, (uint64_t)attr->st_size);
    if (!e && (to_set & FUSE_SET_ATTR_MODE)) {
        mode_t was = n->mode;
        n->mode = attr->st_mode & 07777;
        if ((e = -journal_mode(st, n)) != 0) n->mode = was;
    }
    if (!e && (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_ATIME_NOW |
                         FUSE_SET_ATTR_MTIME_NOW)))
        e = set_times(st, n, attr, to_set);
    if (!e) fill_attr(st, n, &s);
    pthread_mutex_unlock(&st->lock);
    gate_leave(st);
    if (e)
        fuse_reply_err(req, e);
    else
        fuse_reply_attr(req, &s, st->timeout);
}

/* A new node `name` in dir: a directory, or a file at the end of the pack (stage_pack.c) or
 * with a new empty data file; *fd is the file's descriptor. */
static int make_node(stage *st, snode *dir, const char *name, sn_kind kind, mode_t mode,
                     snode **out, int *fd) {
    int e = check_dir(st, dir, name);
    if (e) return e;
    if (tree_child(dir, name, strlen(name))) return EEXIST;
    snode *n = snode_new(kind, name, strlen(name), mode);
    if (!n) return ENOMEM;
    *fd = -1;
    if (kind == SN_FILE) {
        if (tree_attach(dir, n) != 0) {
            snode_free(n);
            return ENOMEM;
        }
        e = stage_pack_claim(st, n, name); /* journaled there */
        tree_detach(n);
        if (!e) {
            *fd = n->fd;
            n->fd = -1;
            if (tree_attach(dir, n) != 0) { /* cannot fail: it was attached a moment ago */
                stage_pack_drop_tail(st, n);
                close(*fd);
                snode_free(n);
                return ENOMEM;
            }
            touch(dir);
            note_uncommitted_change(st);
            *out = n;
            return 0;
        }
        n->src = SRC_SPOOL;
        *fd = spool_data_create(st, &n->data_id);
        if (*fd < 0) {
            snode_free(n);
            return -*fd;
        }
    }
    if (tree_attach(dir, n) != 0) {
        e = ENOMEM;
    } else if ((e = -(kind == SN_DIR ? journal_dir(st, n) : journal_file(st, n))) != 0) {
        tree_detach(n);
    }
    if (e) {
        if (*fd >= 0) {
            close(*fd);
            spool_data_unlink(st, n->data_id);
        }
        snode_free(n);
        return e;
    }
    touch(dir);
    note_uncommitted_change(st);
    *out = n;
    return 0;
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode) {
    stage *st = st_of(req);
    if (!gate_enter(st)) {
        fuse_reply_err(req, EBUSY);
        return;
    }
    pthread_mutex_lock(&st->lock);
    snode *n;
    int fd;
    int e = make_node(st, node_of(st, parent), name, SN_DIR, mode, &n, &fd);
    if (e)
        fuse_reply_err(req, e);
    else
        reply_entry(req, st, n);
    pthread_mutex_unlock(&st->lock);
    gate_leave(st);
}

static void op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev) {
    (void)rdev;
    stage *st = st_of(req);
    if (!S_ISREG(mode)) { /* tensors are regular files; nothing else can be packed */
        fuse_reply_err(req, EPERM);
        return;
    }
    if (!gate_enter(st)) {
        fuse_reply_err(req, EBUSY);
        return;
    }
    pthread_mutex_lock(&st->lock);
    snode *n;
    int fd;
    int e = make_node(st, node_of(st, parent), name, SN_FILE, mode, &n, &fd);
    if (e) {
        fuse_reply_err(req, e);
    } else {
        close(fd);
        reply_entry(req, st, n);
    }
    pthread_mutex_unlock(&st->lock);
    gate_leave(st);
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
                      struct fuse_file_info *fi) {
    stage *st = st_of(req);
    handle *h = calloc(1, sizeof *h);
    if (!h) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    if (!gate_enter(st)) {
        free(h);
        fuse_reply_err(req, EBUSY);
        return;
    }
    pthread_mutex_lock(&st->lock);
    snode *n;
    int fd;
    bool unsent = false;
    int e = make_node(st, node_of(st, parent), name, SN_FILE, mode, &n, &fd);
    if (e) {
        free(h);
        fuse_reply_err(req, e);
    } else {
        n->fd = fd;
        n->nopen = 1;
        h->node = n;
        h->writer = (fi->flags & O_ACCMODE) != O_RDONLY;
        fi->fh = (uintptr_t)h;
        fi->keep_cache = 0;
        /* A file made to be written (cp, a shell redirection) skips the kernel's page cache:
         * its bytes go from the writer's buffer to the spool with no copy in between, which
         * made `cp` of large tensors into the stage 2-3x faster. Such a handle cannot be
         * mmapped anyway, and every open drops cached pages (keep_cache = 0). */
        fi->direct_io = (fi->flags & O_ACCMODE) == O_WRONLY;
        struct fuse_entry_param ep;
        memset(&ep, 0, sizeof ep);
        ep.ino = ino_of(st, n);
        ep.attr_timeout = ep.entry_timeout = st->timeout;
        fill_attr(st, n, &ep.attr);
        n->nlookup++;
        handle_track(st, h);
        unsent = fuse_reply_create(req, &ep, fi) != 0;
    }
    pthread_mutex_unlock(&st->lock);
    gate_leave(st);
    if (unsent) handle_release(st, h); /* no RELEASE will come for a handle never delivered */
}

static void op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name) {
    (void)link, (void)parent, (void)name;
    fuse_reply_err(req, EPERM); /* a staged tensor is a file of bytes, never a link */
}

static void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t parent, const char *name) {
    (void)ino, (void)parent, (void)name;
    fuse_reply_err(req, EPERM);
}

/* Takes n out of the tree; its bytes go when nothing refers to them. Under st->lock. */
static void discard(stage *st, snode *n) {
    tree_detach(n);
    n->removed = true;
    if (n->kind == SN_FILE && n->src == SRC_SPOOL) spool_data_unlink(st, n->data_id);
    /* the pack's last file, closed: its bytes come off the end (an open one, at its release) */
    if (n->kind == SN_FILE && n->src == SRC_PACK && n->nopen == 0) stage_pack_drop_tail(st, n);
    n->removed_next = st->removed; /* listed first: tree_release_if_unused may free it now */
    if (st->removed) st->removed->removed_prev = &n->removed_next;
    n->removed_prev = &st->removed;
    st->removed = n;
    tree_release_if_unused(n);
}

static void remove_entry(fuse_req_t req, fuse_ino_t parent, const char *name, bool dir) {
    stage *st = st_of(req);
    if (!gate_enter(st)) {
        fuse_reply_err(req, EBUSY);
        return;
    }
    pthread_mutex_lock(&st->lock);
    snode *p = node_of(st, parent);
    int e = check_dir(st, p, name);
    snode *n = e ? NULL : tree_child(p, name, strlen(name));
    if (!e && !n) e = ENOENT;
    if (!e && dir && n->kind != SN_DIR) e = ENOTDIR;
    if (!e && !dir && n->kind == SN_DIR) e = EISDIR;
    if (!e && dir && n->nchildren) e = ENOTEMPTY;
    if (!e) e = -journal_remove(st, n);
    if (!e) {
        discard(st, n);
        touch(p);
        note_uncommitted_change(st);
    }
    pthread_mutex_unlock(&st->lock);
    gate_leave(st);
    fuse_reply_err(req, e);
}

static void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name) {
    remove_entry(req, parent, name, false);
}

static void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name) {
    remove_entry(req, parent, name, true);
}

static void op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
                      const char *newname, unsigned int flags) {
    stage *st = st_of(req);
    if (flags & ~(unsigned)RENAME_NOREPLACE) {
        fuse_reply_err(req, EINVAL); /* RENAME_EXCHANGE, RENAME_WHITEOUT */
        return;
    }
    if (!gate_enter(st)) {
        fuse_reply_err(req, EBUSY);
        return;
    }
    pthread_mutex_lock(&st->lock);
    snode *p = node_of(st, parent), *np = node_of(st, newparent);
    int e = check_dir(st, p, name);
    if (!e) e = check_dir(st, np, newname);
    snode *n = e ? NULL : tree_child(p, name, strlen(name));
    if (!e && !n) e = ENOENT;
    if (!e && n->kind == SN_DIR && tree_is_ancestor(n, np)) e = EINVAL;
    snode *t = e ? NULL : tree_child(np, newname, strlen(newname));
    if (!e && t && t != n) {
        if (flags & RENAME_NOREPLACE)
            e = EEXIST;
        else if (n->kind == SN_DIR && t->kind != SN_DIR)
            e = ENOTDIR;
        else if (n->kind != SN_DIR && t->kind == SN_DIR)
            e = EISDIR;
        else if (t->kind == SN_DIR && t->nchildren)
            e = ENOTEMPTY;
    }
    if (!e && t != n) {
        e = -journal_rename(st, n, np, newname);
        if (!e && t) discard(st, t);
        if (!e && tree_rename(n, np, newname, strlen(newname)) != 0) e = ENOMEM;
        if (!e) {
            touch(p);
            touch(np);
            note_uncommitted_change(st);
        }
        /* a sidecar, .npy or folder file is never read from the pack: it moves out */
        if (!e && n->kind == SN_FILE && n->src == SRC_PACK && !stage_pack_name_ok(newname))
            e = stage_copy_up(st, n);
    }
    pthread_mutex_unlock(&st->lock);
    gate_leave(st);
    fuse_reply_err(req, e);
}

/* ---- directories: listed from a copy taken at opendir ---- */

typedef struct dir_entry {
    char *name;
    fuse_ino_t ino;
    mode_t type;
} dir_entry;

typedef struct dir_list {
    dir_entry *e;
    size_t n;
} dir_list;

static bool list_add(dir_list *l, size_t cap, const char *name, fuse_ino_t ino, mode_t type) {
    if (l->n == cap || !(l->e[l->n].name = strdup(name))) return false;
    l->e[l->n].ino = ino;
    l->e[l->n].type = type;
    l->n++;
    return true;
}

static void list_free(dir_list *l) {
    for (size_t i = 0; i < l->n; i++) free(l->e[i].name);
    free(l->e);
    free(l);
}

static void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    stage *st = st_of(req);
    pthread_mutex_lock(&st->lock);
    snode *n = node_of(st, ino);
    if (n->kind != SN_DIR && n->kind != SN_CONTROL_DIR) {
        pthread_mutex_unlock(&st->lock);
        fuse_reply_err(req, ENOTDIR);
        return;
    }
    size_t cap = n->nchildren + 5;
    dir_list *l = calloc(1, sizeof *l);
    bool ok = l && (l->e = calloc(cap, sizeof *l->e));
    fuse_ino_t up = n == st->root ? FUSE_ROOT_ID : ino_of(st, n->parent ? n->parent : st->root);
    if (n->kind == SN_CONTROL_DIR) up = FUSE_ROOT_ID;
    ok = ok && list_add(l, cap, ".", ino, S_IFDIR) && list_add(l, cap, "..", up, S_IFDIR);
    if (ok && n == st->root) ok = list_add(l, cap, CONTROL_NAME, ino_of(st, &st->control), S_IFDIR);
    if (ok && n->kind == SN_CONTROL_DIR)
        ok = list_add(l, cap, "commit", ino_of(st, &st->commit_node), S_IFREG) &&
             list_add(l, cap, "status", ino_of(st, &st->status_node), S_IFREG);
    for (size_t b = 0; ok && b < n->nbuckets; b++)
        for (snode *c = n->buckets[b]; ok && c; c = c->hash_next)
            ok = list_add(l, cap, c->name, ino_of(st, c), c->kind == SN_DIR ? S_IFDIR : S_IFREG);
    pthread_mutex_unlock(&st->lock);
    if (!ok) {
        if (l) list_free(l);
        fuse_reply_err(req, ENOMEM);
        return;
    }
    fi->fh = (uintptr_t)l;
    fuse_reply_open(req, fi);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                       struct fuse_file_info *fi) {
    (void)ino;
    dir_list *l = (dir_list *)(uintptr_t)fi->fh;
    char *buf = malloc(size);
    if (!buf) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    size_t used = 0;
    for (size_t k = (size_t)off; k < l->n; k++) {
        struct stat s;
        memset(&s, 0, sizeof s);
        s.st_ino = l->e[k].ino;
        s.st_mode = l->e[k].type;
        size_t need =
            fuse_add_direntry(req, buf + used, size - used, l->e[k].name, &s, (off_t)k + 1);
        if (need > size - used) break;
        used += need;
    }
    fuse_reply_buf(req, buf, used);
    free(buf);
}

static void op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)ino;
    list_free((dir_list *)(uintptr_t)fi->fh);
    fuse_reply_err(req, 0);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino) {
    (void)ino;
    stage *st = st_of(req);
    struct statvfs sv; /* the room the spool has is the room staging has */
    if (fstatvfs(st->spool_fd, &sv) != 0) {
        fuse_reply_err(req, errno);
        return;
    }
    sv.f_namemax = NAME_MAX_BYTES;
    fuse_reply_statfs(req, &sv);
}

const struct fuse_lowlevel_ops stage_ops = {
    .init = op_init,
    .lookup = op_lookup,
    .forget = op_forget,
    .forget_multi = op_forget_multi,
    .getattr = op_getattr,
    .setattr = op_setattr,
    .mknod = op_mknod,
    .mkdir = op_mkdir,
    .unlink = op_unlink,
    .rmdir = op_rmdir,
    .symlink = op_symlink,
    .link = op_link,
    .rename = op_rename,
    .open = stage_op_open,
    .read = stage_op_read,
    .write = stage_op_write,
    .flush = stage_op_flush,
    .release = stage_op_release,
    .fsync = stage_op_fsync,
    .opendir = op_opendir,
    .readdir = op_readdir,
    .releasedir = op_releasedir,
    .statfs = op_statfs,
    .create = op_create,
    .fallocate = stage_op_fallocate,
};
