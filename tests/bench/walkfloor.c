/* Bare read-only FUSE daemon serving a directory tree's names and attributes from memory: the
 * floor of a first walk over FUSE, which ckptfs's tree walk is measured against.
 * Usage: walkfloor SRCDIR MNT [-f] [-s]
 * SRCDIR is read once at start (names and lstat of every entry, symlinks not followed). The
 * daemon then does the least any FUSE file system can do per request: LOOKUP, GETATTR and
 * READDIRPLUS answered from sorted arrays, OPENDIR answered ENOSYS (so the kernel sends no
 * OPENDIR/RELEASEDIR), READDIRPLUS for every chunk, the same long timeouts and the same
 * multithreaded loop (clone_fd) as ckptfs. Files have their sizes but no content. */
#define FUSE_USE_VERSION 35
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_session.h"

#define TIMEOUT 86400.0

typedef struct node {
    char *name;
    struct stat st;
    size_t first, count; /* children: nodes[first .. first + count), sorted by name */
} node;

static node *nodes; /* nodes[0] is the root (ino 1); node i has ino i + 1 */
static size_t nnodes, cap;

static int add_node(const char *name, const struct stat *st) {
    if (nnodes == cap) {
        size_t ncap = cap ? cap * 2 : 1024;
        node *n = realloc(nodes, ncap * sizeof *n);
        if (!n) return -1;
        nodes = n, cap = ncap;
    }
    nodes[nnodes] = (node){.name = strdup(name), .st = *st};
    if (!nodes[nnodes].name) return -1;
    nodes[nnodes].st.st_ino = nnodes + 1;
    nnodes++;
    return 0;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const node *)a)->name, ((const node *)b)->name);
}

/* Breadth first, so that each directory's children are one contiguous, sorted range. */
static int load(const char *src) {
    struct stat st;
    if (lstat(src, &st) != 0 || add_node("", &st) != 0) return -1;
    char **paths = malloc(sizeof *paths);
    if (!paths || !(paths[0] = strdup(src))) return -1;
    for (size_t i = 0; i < nnodes; i++) {
        if (!S_ISDIR(nodes[i].st.st_mode)) continue;
        DIR *d = opendir(paths[i]);
        if (!d) return -1;
        nodes[i].first = nnodes;
        for (struct dirent *de; (de = readdir(d));) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
            if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
                add_node(de->d_name, &st) != 0) {
                closedir(d);
                return -1;
            }
        }
        closedir(d);
        nodes[i].count = nnodes - nodes[i].first;
        qsort(nodes + nodes[i].first, nodes[i].count, sizeof *nodes, cmp_name);
        char **np = realloc(paths, nnodes * sizeof *paths);
        if (!np) return -1;
        paths = np;
        for (size_t k = nodes[i].first; k < nnodes; k++) {
            nodes[k].st.st_ino = k + 1; /* sorting moved them */
            size_t len = strlen(paths[i]) + strlen(nodes[k].name) + 2;
            if (!(paths[k] = malloc(len))) return -1;
            snprintf(paths[k], len, "%s/%s", paths[i], nodes[k].name);
        }
    }
    for (size_t i = 0; i < nnodes; i++) free(paths[i]);
    free(paths);
    return 0;
}

static node *node_of(fuse_ino_t ino) {
    return ino >= 1 && ino <= nnodes ? &nodes[ino - 1] : NULL;
}

static void wf_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
    struct fuse_entry_param e = {.attr_timeout = TIMEOUT, .entry_timeout = TIMEOUT};
    node *p = node_of(parent);
    if (p && p->count) {
        node key = {.name = (char *)name};
        node *hit = bsearch(&key, nodes + p->first, p->count, sizeof *nodes, cmp_name);
        if (hit) e.ino = hit->st.st_ino, e.attr = hit->st;
    }
    fuse_reply_entry(req, &e); /* ino 0: a cached negative entry */
}

static void wf_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)fi;
    node *n = node_of(ino);
    if (n)
        fuse_reply_attr(req, &n->st, TIMEOUT);
    else
        fuse_reply_err(req, ENOENT);
}

static void wf_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)ino, (void)fi;
    fuse_reply_err(req, ENOSYS);
}

/* Offsets: 1 = after ".", 2 = after "..", 2 + k = after child k. */
static void wf_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                           struct fuse_file_info *fi) {
    (void)fi;
    node *d = node_of(ino);
    if (!d || !S_ISDIR(d->st.st_mode)) {
        fuse_reply_err(req, ENOTDIR);
        return;
    }
    char *buf = malloc(size ? size : 1);
    if (!buf) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    size_t used = 0;
    for (off_t k = off; k < (off_t)d->count + 2; k++) {
        struct fuse_entry_param e = {.attr_timeout = TIMEOUT, .entry_timeout = TIMEOUT};
        const char *name = k == 0 ? "." : "..";
        if (k < 2)
            e.attr = d->st; /* ino 0 in the reply's entry: the kernel links no dentry */
        else {
            node *c = &nodes[d->first + (size_t)k - 2];
            name = c->name, e.ino = c->st.st_ino, e.attr = c->st;
        }
        size_t n = fuse_add_direntry_plus(req, buf + used, size - used, name, &e, k + 1);
        if (n > size - used) break;
        used += n;
    }
    fuse_reply_buf(req, buf, used);
    free(buf);
}

static void wf_init(void *ud, struct fuse_conn_info *conn) {
    (void)ud;
    conn->want &= ~FUSE_CAP_READDIRPLUS_AUTO; /* READDIRPLUS for every chunk, as ckptfs */
}

static const struct fuse_lowlevel_ops ops = {.init = wf_init,
                                             .lookup = wf_lookup,
                                             .getattr = wf_getattr,
                                             .opendir = wf_opendir,
                                             .readdirplus = wf_readdirplus};

int main(int argc, char *argv[]) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s SRCDIR MNT [-f] [-s]\n", argv[0]);
        return 1;
    }
    if (load(argv[1]) != 0) {
        fprintf(stderr, "walkfloor: %s: %s\n", argv[1], strerror(errno ? errno : ENOMEM));
        return 1;
    }
    argv[1] = argv[0]; /* fuse_parse_cmdline sees: PROG MNT [-f] [-s] */
    struct fuse_args args = FUSE_ARGS_INIT(argc - 1, argv + 1);
    struct fuse_cmdline_opts co = {0};
    if (fuse_parse_cmdline(&args, &co) != 0 || !co.mountpoint) {
        free(co.mountpoint);
        fuse_opt_free_args(&args);
        return 1;
    }
    return bench_serve(&args, &co, &ops, sizeof ops, "-oro,fsname=walkfloor", 8, NULL);
}
