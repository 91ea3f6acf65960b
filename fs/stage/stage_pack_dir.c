/* An HF directory OUT made of packs: each pack is a shard.
 *
 * Tensors copied into a stage of DIR/ are appended to a pack (stage_pack.c) until it holds
 * max_shard_size bytes; the next file starts a new pack. A commit then only writes headers:
 *
 *   - a pack whose tensors tile it from PACK_DATA_START is a shard as it is; the tensors past
 *     the greedy cut of max_shard_size (the file that crossed it) move to another pack, and
 *     are journaled there before the pack is cut back (a file opened meanwhile would read
 *     the old place: then OUT is written whole by ckpt_write instead);
 *   - a pack with holes (a file removed, rewritten or truncated after it was closed), and the
 *     tensors from elsewhere (the --from source, data files, packs of earlier commits that
 *     changed) are appended to packs with room, or to new ones (copy_file_range, a reflink
 *     where the file system can): the compaction, only where it is needed;
 *   - a pack that is already a shard of OUT (linked there by an earlier commit) is linked
 *     again only when its header comes out the same; else it is never written to, and its
 *     tensors are copied like those from elsewhere.
 *
 * Each shard gets its header in front and is fsynced; the writer (ckpt_write_packed_dir) then
 * links them into a directory .OUT.partial-XXXXXX beside OUT with the index and the
 * config/tokenizer files, which replaces OUT (rename, or the exchange of
 * core/write/writers/safetensors_dir.c). A kill before that
 * leaves the old OUT; the stage's clean-up removes the partial directory and packs made for
 * the commit, and the journal still says where every staged byte is. */
#include "stage_pack_whole.h"

#include "core/views/hfview.h"
#include "core/util/utf8.h"
#include "core/write/writer.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct shard {
    uint64_t id;
    int fd;
    dev_t dev;
    ino_t ino;
    bool in_out;   /* linked into OUT by an earlier commit: never written to */
    bool created;  /* made by this commit for tensors from elsewhere */
    bool used;     /* becomes a shard of the new OUT */
    bool kept;     /* in_out and unchanged: linked again without a write */
    bool moved_in; /* holds files moved here from a cut pack: stays in the spool */
    uint64_t live, end, size0;
    placed *t;
    size_t n, cap;
} shard;

typedef struct job {
    stage *st;
    ckpt_catalog *cat;
    ckpt_err *err;
    uint64_t max;
    shard *s;
    size_t ns, cap;
    size_t *rest; /* tensors to append */
    size_t nrest;
    snode **moving; /* rest[k]'s node when it is a file moved out of a cut pack, else NULL */
    uint64_t *moved_id, *moved_off;
    char *buf;
} job;

static void collect_ids(const snode *dir, job *j) {
    for (size_t b = 0; b < dir->nbuckets; b++)
        for (const snode *c = dir->buckets[b]; c; c = c->hash_next) {
            if (c->kind == SN_DIR) {
                collect_ids(c, j);
                continue;
            }
            if (c->kind != SN_FILE || c->src != SRC_PACK) continue;
            bool seen = false;
            for (size_t k = 0; k < j->ns && !seen; k++) seen = j->s[k].id == c->data_id;
            if (seen) continue;
            if (j->ns == j->cap) {
                size_t cap = j->cap ? j->cap * 2 : 8;
                shard *s = realloc(j->s, cap * sizeof *s);
                if (!s) continue; /* its tensors are then copied like any other */
                j->s = s;
                j->cap = cap;
            }
            j->s[j->ns++] = (shard){.id = c->data_id, .fd = -1};
        }
}

static int id_cmp(const void *a, const void *b) {
    uint64_t x = ((const shard *)a)->id, y = ((const shard *)b)->id;
    return (x > y) - (x < y);
}

static snode *node_at(const snode *dir, uint64_t id, uint64_t off) {
    for (size_t b = 0; b < dir->nbuckets; b++)
        for (snode *c = dir->buckets[b]; c; c = c->hash_next) {
            if (c->kind == SN_DIR) {
                snode *f = node_at(c, id, off);
                if (f) return f;
            } else if (c->kind == SN_FILE && c->src == SRC_PACK && c->data_id == id &&
                       c->pack_off == off) {
                return c;
            }
        }
    return NULL;
}

static int add_placed(shard *s, size_t tensor, uint64_t off) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        placed *p = realloc(s->t, cap * sizeof *p);
        if (!p) return -ENOMEM;
        s->t = p;
        s->cap = cap;
    }
    s->t[s->n++] = (placed){tensor, off};
    return 0;
}

static int new_shard(job *j, shard **out) {
    if (j->ns == j->cap) {
        size_t cap = j->cap ? j->cap * 2 : 8;
        shard *s = realloc(j->s, cap * sizeof *s);
        if (!s) return -ENOMEM;
        j->s = s;
        j->cap = cap;
    }
    uint64_t id;
    pthread_mutex_lock(&j->st->lock);
    int fd = spool_data_create(j->st, &id);
    pthread_mutex_unlock(&j->st->lock);
    if (fd < 0) return fd;
    if (ftruncate(fd, PACK_DATA_START) != 0) {
        int e = -errno;
        close(fd);
        spool_data_unlink(j->st, id);
        return e;
    }
    shard *s = &j->s[j->ns++];
    *s = (shard){.id = id,
                 .fd = fd,
                 .created = true,
                 .used = true,
                 .live = PACK_DATA_START,
                 .end = PACK_DATA_START,
                 .size0 = PACK_DATA_START};
    *out = s;
    return 0;
}

static int rest_add(job *j, size_t tensor, snode *moving) {
    j->moving[j->nrest] = moving;
    j->rest[j->nrest++] = tensor;
    return 0;
}

/* Whether the header in front of a shard of OUT is the one it would get now. */
static bool same_header(const job *j, const shard *s) {
    return ckpt_packed_header_is(s->fd, j->cat, s->t, s->n, PACK_DATA_START);
}

/* Sorts the tensors that are in the packs already into shards and the rest. */
static int sort_out(job *j) {
    stage *st = j->st;
    size_t nt = j->cat->ntensors ? j->cat->ntensors : 1;
    j->rest = malloc(nt * sizeof *j->rest);
    j->moving = calloc(nt, sizeof *j->moving);
    j->moved_id = calloc(nt, sizeof *j->moved_id);
    j->moved_off = calloc(nt, sizeof *j->moved_off);
    if (!j->rest || !j->moving || !j->moved_id || !j->moved_off) return -ENOMEM;
    for (size_t k = 0; k < j->ns; k++) {
        shard *s = &j->s[k];
        struct stat ps;
        s->fd = spool_data_open(st, s->id);
        if (s->fd < 0 || fstat(s->fd, &ps) != 0) {
            if (s->fd >= 0) close(s->fd);
            s->fd = -1;
            continue;
        }
        s->dev = ps.st_dev;
        s->ino = ps.st_ino;
        s->in_out = ps.st_nlink > 1;
        s->size0 = (uint64_t)ps.st_size;
    }
    for (size_t i = 0; i < j->cat->ntensors; i++) {
        const ckpt_tensor *t = &j->cat->tensors[i];
        if (t->aside) continue;
        if (!ckpt_packed_fits(t)) return 1;
        const ckpt_piece *p = t->npieces == 1 ? &t->pieces[0] : NULL;
        const ckpt_source *src = p ? &j->cat->sources[p->source] : NULL;
        shard *home = NULL;
        for (size_t k = 0; src && !p->strides && t->nbytes && k < j->ns; k++)
            if (j->s[k].fd >= 0 && ckpt_source_is_file(src, j->s[k].dev, j->s[k].ino))
                home = &j->s[k];
        int e = home ? add_placed(home, i, p->file_offset) : rest_add(j, i, NULL);
        if (e) return e;
    }
    pthread_mutex_lock(&st->lock); /* the nodes: open counts change under it */
    for (size_t k = 0; k < j->ns; k++) {
        shard *s = &j->s[k];
        if (s->fd < 0) continue;
        qsort(s->t, s->n, sizeof *s->t, placed_cmp);
        uint64_t at = PACK_DATA_START, in_shard = 0;
        bool tiles = s->n > 0;
        size_t cut = s->n;
        for (size_t i = 0; i < s->n && tiles; i++) {
            uint64_t b = j->cat->tensors[s->t[i].tensor].nbytes;
            if (s->t[i].off != at) tiles = false;
            if (cut == s->n && in_shard > 0 && in_shard + b > j->max) cut = i;
            in_shard += b;
            at += b;
        }
        if (tiles && s->live > at) tiles = false; /* a staged file that is no tensor lies beyond */
        if (tiles && s->in_out) {
            /* OUT's own file: linked again as it is, or not at all */
            tiles = cut == s->n && at == s->size0 && same_header(j, s);
            s->kept = tiles;
        }
        /* Past the cut: files that can move (closed ones) go to another pack */
        for (size_t i = cut; tiles && i < s->n; i++) {
            snode *n = node_at(st->root, s->id, s->t[i].off);
            if (!n || n->nopen) tiles = false;
        }
        if (!tiles) {
            for (size_t i = 0; i < s->n; i++) rest_add(j, s->t[i].tensor, NULL);
            s->n = 0;
            continue;
        }
        for (size_t i = cut; i < s->n; i++)
            rest_add(j, s->t[i].tensor, node_at(st->root, s->id, s->t[i].off));
        s->n = cut;
        s->end = cut ? s->t[cut - 1].off + j->cat->tensors[s->t[cut - 1].tensor].nbytes
                     : PACK_DATA_START;
        s->used = true;
    }
    pthread_mutex_unlock(&st->lock);
    return 0;
}

/* Files of the --from source that are shards as they are: linked, never read or written. */
static int link_whole_sources(job *j) {
    struct stat ds;
    if (!j->nrest || fstat(j->st->data_fd, &ds) != 0) return 0;
    whole_file *w;
    size_t nw;
    int rc = pack_take_whole(j->cat, ds.st_dev, j->max, j->rest, &j->nrest, j->moving, &w, &nw);
    for (size_t i = 0; i < nw; i++) {
        if (!rc && j->ns == j->cap) {
            size_t cap = j->cap ? j->cap * 2 : 8;
            shard *s = realloc(j->s, cap * sizeof *s);
            if (s) {
                j->s = s;
                j->cap = cap;
            } else {
                rc = -ENOMEM;
            }
        }
        if (rc) { /* a shard that is not in the job: its tensors must not be lost */
            close(w[i].fd);
            free(w[i].t);
            continue;
        }
        j->s[j->ns++] = (shard){.fd = w[i].fd,
                                .dev = w[i].dev,
                                .ino = w[i].ino,
                                .in_out = true,
                                .used = true,
                                .kept = true,
                                .t = w[i].t,
                                .n = w[i].n,
                                .cap = w[i].n};
    }
    free(w);
    return rc;
}

/* Appends the rest, widest elements first, to packs with room (not OUT's, not cut), then to
 * new ones. */
static int append_rest(job *j) {
    /* the sort moves the tensors: their moving nodes are found again by tensor */
    snode **by_tensor = calloc(j->cat->ntensors ? j->cat->ntensors : 1, sizeof *by_tensor);
    if (!by_tensor) return -ENOMEM;
    for (size_t k = 0; k < j->nrest; k++) by_tensor[j->rest[k]] = j->moving[k];
    ckpt_packed_sort_widest(j->cat, j->rest, j->nrest);
    int rc = 0;
    size_t target = 0;
    for (size_t k = 0; !rc && k < j->nrest; k++) {
        const ckpt_tensor *t = &j->cat->tensors[j->rest[k]];
        shard *s = NULL;
        for (; target < j->ns; target++) {
            shard *c = &j->s[target];
            uint64_t data = c->end - PACK_DATA_START;
            bool room = data == 0 || data + t->nbytes <= j->max;
            if (c->used && !c->in_out && c->fd >= 0 && c->end >= c->live && room) {
                s = c;
                break;
            }
        }
        if (!s && (rc = new_shard(j, &s))) break;
        rc = ckpt_packed_append(j->cat, t, s->fd, s->end, j->buf, &j->st->progress_done);
        if (rc) {
            char shown[256];
            ckpt_fail(j->err, rc, "%s: appending tensor \"%s\" to a staged shard: %s", j->st->out,
                      utf8_shown(shown, sizeof shown, t->name, t->name_len), strerror(-rc));
            break;
        }
        rc = add_placed(s, j->rest[k], s->end);
        s->end += t->nbytes;
        j->moving[k] = by_tensor[j->rest[k]];
        if (j->moving[k]) {
            j->moved_id[k] = s->id;
            j->moved_off[k] = s->t[s->n - 1].off;
            s->moved_in = true;
        }
    }
    free(by_tensor);
    return rc;
}

/* Files moved out of a cut pack are journaled at their new place before the pack is cut: 0,
 * 1 when one of them is open now, or -errno. */
static int journal_moves(job *j) {
    stage *st = j->st;
    bool any = false;
    pthread_mutex_lock(&st->lock);
    int rc = 0;
    /* A file opened since (for reading) would read the old place: the pack is not cut, OUT
     * is written whole instead */
    for (size_t k = 0; !rc && k < j->nrest; k++)
        if (j->moving[k] && (j->moving[k]->nopen || j->moving[k]->fd >= 0)) rc = 1;
    for (size_t k = 0; !rc && k < j->nrest; k++) {
        snode *n = j->moving[k];
        if (!n) continue;
        uint64_t id = n->data_id, off = n->pack_off;
        n->data_id = j->moved_id[k];
        n->pack_off = j->moved_off[k];
        rc = journal_pack_moved(st, n);
        if (rc) {
            n->data_id = id;
            n->pack_off = off;
        }
        any = true;
    }
    if (!rc && any) rc = journal_sync(st);
    pthread_mutex_unlock(&st->lock);
    return rc;
}

/* The new OUT: the shards this commit keeps or wrote, in the order their packs were made. */
static int publish(job *j, const ckpt_write_opts *opts) {
    ckpt_packed_shard *out = malloc((j->ns ? j->ns : 1) * sizeof *out);
    if (!out) return ckpt_fail(j->err, -ENOMEM, "out of memory");
    size_t n = 0;
    for (size_t k = 0; k < j->ns; k++)
        if (j->s[k].used && j->s[k].n)
            out[n++] = (ckpt_packed_shard){
                .fd = j->s[k].fd, .t = j->s[k].t, .n = j->s[k].n, .keep_mode = j->s[k].kept};
    int rc = ckpt_write_packed_dir(j->cat, j->st->out, out, n, opts, j->err);
    free(out);
    return rc;
}

/* The headers of the shards this commit writes: 1 when one does not fit its reserved room
 * (then OUT is written whole), before anything is cut. */
static int make_headers(job *j, char ***heads) {
    *heads = calloc(j->ns ? j->ns : 1, sizeof **heads);
    if (!*heads) return -ENOMEM;
    for (size_t k = 0; k < j->ns; k++) {
        shard *s = &j->s[k];
        if (!s->used || !s->n || s->kept) continue;
        int e = ckpt_packed_header(j->cat, s->t, s->n, PACK_DATA_START, &(*heads)[k]);
        if (e) return e;
    }
    return 0;
}

/* Each header in front of its shard, which is cut to its end and fsynced. */
static int finish_shards(job *j, char **heads) {
    for (size_t k = 0; k < j->ns; k++) {
        shard *s = &j->s[k];
        if (!heads[k]) continue;
        int e = pack_pwrite_all(s->fd, heads[k], PACK_DATA_START, 0);
        if (!e && ftruncate(s->fd, (off_t)s->end) != 0) e = -errno;
        if (!e && fsync(s->fd) != 0) e = -errno;
        if (e) return ckpt_fail(j->err, e, "%s: writing a shard: %s", j->st->out, strerror(-e));
    }
    return 0;
}

/* After a failed commit: bytes appended beyond every staged file come off again; packs made
 * for it go unless files moved into them. Under st->lock. */
static void undo(job *j) {
    stage *st = j->st;
    for (size_t k = 0; k < j->ns; k++) {
        shard *s = &j->s[k];
        if (s->fd < 0 || s->in_out) continue;
        uint64_t live = pack_live_end(st->root, s->id);
        if (s->created && live == 0) { /* no file moved into it */
            spool_data_unlink(st, s->id);
            continue;
        }
        if (live < PACK_DATA_START) live = PACK_DATA_START;
        if (ftruncate(s->fd, (off_t)live) == 0 && s->id == st->pack_id && st->pack_fd >= 0)
            st->pack_end = live;
    }
}

int stage_pack_dir_commit(stage *st, ckpt_catalog *cat, const ckpt_write_opts *opts,
                          ckpt_err *err) {
    int rc = ckpt_write_check(cat, st->out, opts, err);
    if (rc) return rc;
    job j = {.st = st, .cat = cat, .err = err, .buf = malloc(PACK_COPY_BUF)};
    j.max = st->max_shard_size ? st->max_shard_size : CKPT_HF_MAX_SHARD_DEFAULT;
    pthread_mutex_lock(&st->lock);
    collect_ids(st->root, &j);
    for (size_t k = 0; k < j.ns; k++) j.s[k].live = pack_live_end(st->root, j.s[k].id);
    pthread_mutex_unlock(&st->lock);
    if (j.ns) qsort(j.s, j.ns, sizeof *j.s, id_cmp); /* shards in the order packs were made */
    bool any = false;
    for (size_t i = 0; i < cat->ntensors && !any; i++) any = !cat->tensors[i].aside;
    char **heads = NULL;
    rc = !any ? 1 : j.buf ? sort_out(&j) : -ENOMEM; /* no tensor: the writer's empty shard */
    if (!rc) rc = link_whole_sources(&j);
    if (!rc) rc = append_rest(&j);
    if (!rc) rc = make_headers(&j, &heads);
    if (!rc) rc = journal_moves(&j);
    if (!rc) rc = finish_shards(&j, heads);
    for (size_t k = 0; heads && k < j.ns; k++) free(heads[k]);
    free(heads);

    if (!rc) rc = publish(&j, opts);

    pthread_mutex_lock(&st->lock);
    if (rc) undo(&j);
    for (size_t k = 0; k < j.ns; k++) {
        shard *s = &j.s[k];
        if (s->fd < 0) continue;
        /* a pack made for this commit is OUT's alone once it is in: out of the spool */
        if (!rc && s->created && !s->moved_in) spool_data_unlink(st, s->id);
        close(s->fd);
    }
    if (!rc && st->pack_fd >= 0) {
        /* every pack is a shard of OUT now: never appended to again */
        close(st->pack_fd);
        st->pack_fd = -1;
    }
    pthread_mutex_unlock(&st->lock);
    for (size_t k = 0; k < j.ns; k++) free(j.s[k].t);
    free(j.s);
    free(j.rest);
    free(j.moving);
    free(j.moved_id);
    free(j.moved_off);
    free(j.buf);
    return rc;
}
