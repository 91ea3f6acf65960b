/* The journal: the staged tree as records appended in order, one per line, so that a killed
 * daemon loses nothing (the page cache keeps what write(2) took).
 *
 *   d PATH MODE        a directory            f PATH MODE ID   a file whose bytes are data/ID
 *   l PATH MODE SRC    a source file, by the path the source shows it at
 *   r OLD NEW          rename, replacing NEW  u PATH           remove
 *   m PATH MODE        chmod                  c                start from an empty tree
 *   p PATH MODE ID OFF [SIZE]  a file whose bytes are [OFF, OFF+SIZE) of the pack data/ID;
 *                      without SIZE it owned the pack's tail: it ends where the pack ends
 *   s PATH SIZE        the size of a file in a pack, once it was closed
 *   C                  committed: OUT holds what is staged     w   changed since
 *
 * Paths start with '/' and are %XX-encoded. A journal starts from the source's tree; each
 * mount replays it and rewrites it as a snapshot ("c", one record per node, then C or w).
 * Every record is one write(2); one cut short by a full disk is truncated away again, and
 * replay ignores a last line without its newline. */
#include "stage_fs.h"
#include "common/message.h"

#include "core/util/hashmap.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define JOURNAL_HEADER "ckptfs-stage-journal 1"

/* ---- paths in records: bytes <= 0x20, 0x7F and '%' as %XX (text_pct_escape with space) ---- */

static size_t stage_decode(char *s) {
    size_t n;
    text_pct_unescape(s, &n, false);
    return n;
}

/* "/a/b" for a node (the root is "/"). */
static void put_node_path(strbuf *sb, const snode *n) {
    strbuf p;
    sb_init(&p);
    tree_path(n, &p);
    sb_putc(sb, '/');
    if (p.data) text_pct_escape(sb, p.data, p.len, true);
    if (p.failed) sb->failed = true;
    sb_free(&p);
}

/* ---- journal ---- */

static off_t journal_size(const stage *st) {
    struct stat s;
    return fstat(st->journal_fd, &s) == 0 ? s.st_size : -1;
}

static int append(stage *st, strbuf *rec) {
    if (rec->failed) return -ENOMEM;
    off_t before = journal_size(st);
    size_t done = 0;
    while (done < rec->len) {
        ssize_t w = write(st->journal_fd, rec->data + done, rec->len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : ENOSPC;
            /* A record cut short would run into the next one: take it back. */
            if (before >= 0 && ftruncate(st->journal_fd, before) != 0) {
                /* nothing more to do: replay ignores what it cannot parse */
            }
            return -e;
        }
        done += (size_t)w;
    }
    return 0;
}

/* The source path of a lower file, escaped: the tensor's raw file or its sidecar. */
static void put_lower_path(strbuf *sb, const ckpt_tensor *t, sn_src src) {
    if (src == SRC_LOWER_RAW) {
        text_pct_escape(sb, t->path, strlen(t->path), true);
        return;
    }
    text_pct_escape(sb, t->path, ckpt_sidecar_stem(t), true);
    text_pct_escape(sb, ".json", 5, true);
}

static int append_node_record(stage *st, char op, const snode *n, bool with_mode) {
    strbuf rec;
    sb_init(&rec);
    sb_putc(&rec, op == 'P' ? 'p' : op);
    sb_putc(&rec, ' ');
    put_node_path(&rec, n);
    if (with_mode) sb_printf(&rec, " %o", (unsigned)n->mode);
    if (op == 'f') {
        char name[17];
        spool_data_name(n->data_id, name);
        sb_printf(&rec, " %s", name);
    } else if (op == 'p' || op == 'P') {
        char name[17];
        spool_data_name(n->data_id, name);
        sb_printf(&rec, " %s %llu", name, (unsigned long long)n->pack_off);
        if (op == 'P') { /* a closed file moved whole: its size in the same record */
            sb_printf(&rec, " %llu", (unsigned long long)n->pack_size);
        }
    } else if (op == 's') {
        sb_printf(&rec, " %llu", (unsigned long long)n->pack_size);
    } else if (op == 'l') {
        const ckpt_tensor *t = &st->lower->tensors[n->lower];
        sb_putc(&rec, ' ');
        put_lower_path(&rec, t, n->src);
    }
    sb_putc(&rec, '\n');
    int rc = append(st, &rec);
    sb_free(&rec);
    return rc;
}

int journal_dir(stage *st, const snode *n) {
    return append_node_record(st, 'd', n, true);
}

int journal_file(stage *st, const snode *n) {
    return append_node_record(st, n->src == SRC_SPOOL ? 'f' : 'l', n, true);
}

int journal_pack(stage *st, const snode *n) {
    return append_node_record(st, 'p', n, true);
}

int journal_pack_moved(stage *st, const snode *n) {
    return append_node_record(st, 'P', n, true);
}

int journal_pack_size(stage *st, const snode *n) {
    return append_node_record(st, 's', n, false);
}

int journal_remove(stage *st, const snode *n) {
    return append_node_record(st, 'u', n, false);
}

int journal_mode(stage *st, const snode *n) {
    return append_node_record(st, 'm', n, true);
}

int journal_rename(stage *st, const snode *n, const snode *new_parent, const char *new_name) {
    strbuf rec;
    sb_init(&rec);
    sb_puts(&rec, "r ");
    put_node_path(&rec, n);
    sb_putc(&rec, ' ');
    put_node_path(&rec, new_parent);
    if (new_parent->parent) sb_putc(&rec, '/'); /* the root's path is "/" already */
    text_pct_escape(&rec, new_name, strlen(new_name), true);
    sb_putc(&rec, '\n');
    int rc = append(st, &rec);
    sb_free(&rec);
    return rc;
}

int journal_mark(stage *st, char mark) {
    strbuf rec;
    sb_init(&rec);
    sb_putc(&rec, mark);
    sb_putc(&rec, '\n');
    int rc = append(st, &rec);
    sb_free(&rec);
    return rc;
}

int journal_sync(stage *st) {
    return fdatasync(st->journal_fd) == 0 ? 0 : -errno;
}

/* ---- replay ---- */

typedef struct replay {
    stage *st;
    const hashmap *lower_paths;
    size_t line;
    size_t skipped;
} replay;

static void skip(replay *r, const char *why) {
    if (r->skipped++ < 10)
        msg_error("stage", "%s/journal line %zu: %s (skipped)", r->st->spool, r->line, why);
}

/* The parent directory of "/a/b/c" and the last name ("c"). */
static snode *parent_of(stage *st, char *path, size_t len, char **name) {
    if (len < 2 || path[0] != '/') return NULL;
    char *slash = strrchr(path, '/');
    *name = slash + 1;
    if (!**name) return NULL;
    snode *p =
        slash == path ? st->root : tree_resolve(st->root, path + 1, (size_t)(slash - path - 1));
    return p && p->kind == SN_DIR ? p : NULL;
}

static snode *node_at(stage *st, char *path, size_t len) {
    if (len < 1 || path[0] != '/') return NULL;
    return tree_resolve(st->root, path + 1, len - 1);
}

static bool parse_mode(const char *s, mode_t *mode) {
    char *end;
    unsigned long v = strtoul(s, &end, 8);
    if (!*s || *end || v > 07777) return false;
    *mode = (mode_t)v;
    return true;
}

static bool parse_u64(const char *s, uint64_t *v) {
    char *end;
    if (*s < '0' || *s > '9') return false;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (*end || errno) return false;
    *v = x;
    return true;
}

static void clear_children(snode *dir) {
    for (size_t b = 0; b < dir->nbuckets; b++) {
        snode *c = dir->buckets[b];
        while (c) {
            snode *next = c->hash_next;
            c->parent = NULL;
            snode_free_tree(c);
            c = next;
        }
        dir->buckets[b] = NULL;
    }
    dir->nchildren = 0;
}

static void remove_subtree(snode *n) {
    tree_detach(n);
    snode_free_tree(n);
}

/* A file record: a new node, or a new source for the file already there. */
static void apply_file(replay *r, char *path, size_t len, mode_t mode, sn_src src, uint64_t id,
                       size_t lower, uint64_t lower_size) {
    char *name;
    snode *parent = parent_of(r->st, path, len, &name);
    if (!parent) return skip(r, "no such directory");
    snode *f = tree_child(parent, name, strlen(name));
    if (f && f->kind != SN_FILE) return skip(r, "a directory is in the way");
    if (!f) {
        if (!(f = snode_new(SN_FILE, name, strlen(name), mode)) || tree_attach(parent, f) != 0) {
            snode_free(f);
            return skip(r, "out of memory");
        }
    }
    f->mode = mode;
    f->src = src;
    f->data_id = id;
    f->lower = lower;
    f->lower_size = lower_size;
    if ((src == SRC_LOWER_RAW || src == SRC_LOWER_SIDECAR) && r->st->lower->tensors[lower].npieces)
        f->mtime = r->st->lower->sources[r->st->lower->tensors[lower].pieces[0].source].mtime;
}

/* The tensor whose raw file or sidecar (*sidecar) the source shows at p, from the map of raw
 * paths: sidecar paths are not stored (x.json is the sidecar of x, or of x.raw). */
static bool lower_file(const ckpt_catalog *cat, const hashmap *raw_paths, const char *p, size_t len,
                       size_t *tensor, bool *sidecar) {
    const hm_entry *e = hm_get(raw_paths, p, len);
    *sidecar = e == NULL;
    if (!e && len > 5 && len < PATH_MAX && memcmp(p + len - 5, ".json", 5) == 0) {
        if (!(e = hm_get(raw_paths, p, len - 5)) || cat->tensors[e->value].path_raw) {
            char raw[PATH_MAX];
            memcpy(raw, p, len - 5);
            memcpy(raw + len - 5, ".raw", 4);
            e = hm_get(raw_paths, raw, len - 1);
            if (e && !cat->tensors[e->value].path_raw) e = NULL;
        }
    }
    if (!e) return false;
    *tensor = e->value;
    return true;
}

static void apply(replay *r, char **f, int nf) {
    stage *st = r->st;
    char op = f[0][0];
    if (f[0][1]) return skip(r, "unknown record");
    size_t len = nf > 1 ? stage_decode(f[1]) : 0;
    mode_t mode = 0;
    if (op == 'c' || op == 'C' || op == 'w') {
        if (nf != 1) return skip(r, "malformed record");
        if (op == 'c')
            clear_children(st->root);
        else
            st->dirty = op == 'w';
        return;
    }
    st->dirty = true;
    switch (op) {
    case 'd': {
        char *name;
        snode *parent;
        if (nf != 3 || !parse_mode(f[2], &mode)) return skip(r, "malformed record");
        if (!(parent = parent_of(st, f[1], len, &name))) return skip(r, "no such directory");
        snode *d = tree_child(parent, name, strlen(name));
        if (d && d->kind != SN_DIR) return skip(r, "a file is in the way");
        if (!d && !(d = tree_ensure_dir(parent, name, strlen(name))))
            return skip(r, "out of memory");
        d->mode = mode;
        return;
    }
    case 'f': {
        uint64_t id;
        if (nf != 4 || !parse_mode(f[2], &mode) || !spool_parse_id(f[3], &id))
            return skip(r, "malformed record");
        /* Its data file may be gone for good reason (a later record removes the file, and
         * its bytes went with it): checked once the whole journal is applied. */
        return apply_file(r, f[1], len, mode, SRC_SPOOL, id, 0, 0);
    }
    case 'p': {
        uint64_t id, off, size = UINT64_MAX;
        if ((nf != 5 && nf != 6) || !parse_mode(f[2], &mode) || !spool_parse_id(f[3], &id) ||
            !parse_u64(f[4], &off) || off < PACK_DATA_START || (nf == 6 && !parse_u64(f[5], &size)))
            return skip(r, "malformed record");
        apply_file(r, f[1], len, mode, SRC_PACK, id, 0, 0);
        snode *n = node_at(st, f[1], len);
        if (n && n->kind == SN_FILE && n->src == SRC_PACK) {
            n->pack_off = off;
            n->pack_size = size; /* UINT64_MAX: to the pack's end, settled after the replay */
        }
        return;
    }
    case 's': {
        snode *n;
        uint64_t size;
        if (nf != 3 || !parse_u64(f[2], &size)) return skip(r, "malformed record");
        if (!(n = node_at(st, f[1], len)) || n->kind != SN_FILE || n->src != SRC_PACK)
            return skip(r, "no such file in a pack");
        n->pack_size = size;
        return;
    }
    case 'l': {
        if (nf != 4 || !parse_mode(f[2], &mode)) return skip(r, "malformed record");
        size_t llen = stage_decode(f[3]);
        bool sidecar;
        size_t i;
        if (!st->lower || !lower_file(st->lower, r->lower_paths, f[3], llen, &i, &sidecar))
            return skip(r, "no such file in the source");
        const ckpt_tensor *t = &st->lower->tensors[i];
        uint64_t size = t->nbytes;
        if (sidecar) {
            char *doc = ckpt_sidecar_json(st->lower, t, &size);
            if (!doc) return skip(r, "out of memory");
            free(doc);
        }
        return apply_file(r, f[1], len, mode, sidecar ? SRC_LOWER_SIDECAR : SRC_LOWER_RAW, 0, i,
                          size);
    }
    case 'r': {
        char *name;
        snode *n, *parent;
        if (nf != 3) return skip(r, "malformed record");
        size_t nlen = stage_decode(f[2]);
        if (!(n = node_at(st, f[1], len)) || n == st->root) return skip(r, "no such file");
        if (!(parent = parent_of(st, f[2], nlen, &name))) return skip(r, "no such directory");
        if (tree_is_ancestor(n, parent)) return skip(r, "a directory cannot move into itself");
        snode *target = tree_child(parent, name, strlen(name));
        if (target == n) return;
        if (target) remove_subtree(target);
        if (tree_rename(n, parent, name, strlen(name)) != 0) return skip(r, "out of memory");
        return;
    }
    case 'u': {
        snode *n;
        if (nf != 2) return skip(r, "malformed record");
        if (!(n = node_at(st, f[1], len)) || n == st->root) return skip(r, "no such file");
        remove_subtree(n);
        return;
    }
    case 'm': {
        snode *n;
        if (nf != 3 || !parse_mode(f[2], &mode)) return skip(r, "malformed record");
        if (!(n = node_at(st, f[1], len))) return skip(r, "no such file");
        n->mode = mode;
        return;
    }
    default:
        return skip(r, "unknown record");
    }
}

/* Files whose bytes are missing from the spool after the replay were lost (a spool changed
 * behind our back): said by path, and left out of the tree. */
static void drop_missing_data(replay *r, snode *dir) {
    for (size_t b = 0; b < dir->nbuckets; b++)
        for (snode *c = dir->buckets[b], *next; c; c = next) {
            next = c->hash_next;
            struct stat data;
            if (c->kind == SN_DIR) {
                drop_missing_data(r, c);
            } else if (c->src == SRC_PACK && spool_data_stat(r->st, c->data_id, &data) == 0) {
                /* the owner of the tail at a crash: to the pack's end (the journal proves
                 * where it starts; nothing was appended after it) */
                uint64_t size = (uint64_t)data.st_size;
                if (c->pack_size == UINT64_MAX)
                    c->pack_size = size > c->pack_off ? size - c->pack_off : 0;
                if (c->pack_off + c->pack_size > size) c->pack_size = 0; /* cannot be: lost */
            } else if ((c->src == SRC_SPOOL || c->src == SRC_PACK) &&
                       spool_data_stat(r->st, c->data_id, &data) != 0) {
                strbuf p;
                sb_init(&p);
                tree_path(c, &p);
                char name[17];
                spool_data_name(c->data_id, name);
                msg_error("stage",
                          "%s/data/%s, the bytes of staged file /%s, is missing: "
                          "the file is left out",
                          r->st->spool, name, p.data ? p.data : "?");
                sb_free(&p);
                remove_subtree(c);
            }
        }
}

int journal_replay(stage *st, const hashmap *lower_paths) {
    int fd = openat(st->spool_fd, "journal", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? 0 : -errno;
    FILE *in = fdopen(fd, "r");
    if (!in) {
        close(fd);
        return -ENOMEM;
    }
    replay r = {.st = st, .lower_paths = lower_paths};
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int rc = 0;
    while ((n = getline(&line, &cap, in)) > 0) {
        r.line++;
        if (line[n - 1] != '\n') break; /* cut short by a crash: never acknowledged */
        line[n - 1] = '\0';
        if (r.line == 1) {
            if (strcmp(line, JOURNAL_HEADER) != 0) {
                msg_error("stage",
                          "%s/journal: not a ckptfs journal (first line "
                          "is not \"%s\")",
                          st->spool, JOURNAL_HEADER);
                rc = -EINVAL;
                break;
            }
            continue;
        }
        char *fields[7];
        int nf = 0;
        for (char *save = NULL, *tok = strtok_r(line, " ", &save); tok && nf < 7;
             tok = strtok_r(NULL, " ", &save))
            fields[nf++] = tok;
        if (nf == 0 || nf == 7) {
            skip(&r, "malformed record");
            continue;
        }
        apply(&r, fields, nf);
    }
    free(line);
    fclose(in);
    if (!rc) drop_missing_data(&r, st->root);
    if (r.skipped > 10)
        msg_error("stage", "%s/journal: %zu records skipped in all", st->spool, r.skipped);
    return rc;
}

/* ---- snapshot ---- */

static int snapshot_node(stage *st, strbuf *out, const snode *n) {
    for (size_t b = 0; b < n->nbuckets; b++)
        for (const snode *c = n->buckets[b]; c; c = c->hash_next) {
            sb_putc(out, c->kind == SN_DIR     ? 'd'
                         : c->src == SRC_SPOOL ? 'f'
                         : c->src == SRC_PACK  ? 'p'
                                               : 'l');
            sb_putc(out, ' ');
            put_node_path(out, c);
            sb_printf(out, " %o", (unsigned)c->mode);
            if (c->kind == SN_FILE && c->src == SRC_PACK) {
                char name[17];
                spool_data_name(c->data_id, name);
                sb_printf(out, " %s %llu %llu", name, (unsigned long long)c->pack_off,
                          (unsigned long long)c->pack_size);
            } else if (c->kind == SN_FILE && c->src == SRC_SPOOL) {
                char name[17];
                spool_data_name(c->data_id, name);
                sb_printf(out, " %s", name);
            } else if (c->kind == SN_FILE) {
                const ckpt_tensor *t = &st->lower->tensors[c->lower];
                sb_putc(out, ' ');
                put_lower_path(out, t, c->src);
            }
            sb_putc(out, '\n');
            if (c->kind == SN_DIR) snapshot_node(st, out, c);
        }
    return out->failed ? -ENOMEM : 0;
}

int journal_snapshot(stage *st) {
    strbuf out;
    sb_init(&out);
    sb_puts(&out, JOURNAL_HEADER "\nc\n");
    int rc = snapshot_node(st, &out, st->root);
    sb_puts(&out, st->dirty ? "w\n" : "C\n");
    if (!rc && out.failed) rc = -ENOMEM;
    if (!rc) rc = spool_write_file(st, "journal", out.data, out.len);
    sb_free(&out);
    if (rc) return rc;
    if (st->journal_fd >= 0) close(st->journal_fd);
    st->journal_fd = openat(st->spool_fd, "journal", O_WRONLY | O_APPEND | O_CLOEXEC);
    return st->journal_fd >= 0 ? 0 : -errno;
}

int journal_restore(stage *st, bool resumed, const hashmap *lower_paths) {
    int rc = resumed ? journal_replay(st, lower_paths) : 0;
    if (rc) {
        if (rc == -ENOMEM) msg_error("stage", "out of memory");
        return STAGE_INVALID;
    }
    if ((rc = journal_snapshot(st)) != 0) {
        msg_error("stage", "cannot write %s/journal: %s", st->spool, strerror(-rc));
        return STAGE_INVALID;
    }
    return 0;
}
