/* The spool: everything a staging mount holds, on disk, so a killed daemon loses nothing.
 *
 *   SPOOL/lock         flock'ed by the daemon that serves the stage; holds its pid
 *   SPOOL/state        what the stage is for: "out PATH", "from PATH" and the size and mtime
 *                      of every source file (an overlay over a changed source cannot be
 *                      replayed)
 *   SPOOL/journal      the tree (stage_journal.c)
 *   SPOOL/data/ID      the bytes of one staged file (ID: 16 hex digits)
 *   SPOOL/last-commit  the report of the last commit
 *
 * Data files no journal record refers to are removed once the journal was rewritten. */
#include "stage_fs.h"
#include "common/message.h"
#include "core/util/grow.h"

#include "core/util/hashmap.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define STATE_HEADER "ckptfs-stage 1"

/* ---- data files ---- */

void spool_data_name(uint64_t id, char out[17]) {
    snprintf(out, 17, "%016llx", (unsigned long long)id);
}

int spool_data_path(const stage *st, uint64_t id, strbuf *sb) {
    char name[17];
    spool_data_name(id, name);
    sb_clear(sb);
    sb_printf(sb, "%s/data/%s", st->spool, name);
    return sb->failed ? -ENOMEM : 0;
}

bool spool_parse_id(const char *s, uint64_t *id) {
    if (strlen(s) != 16) return false;
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        int h = text_hex_digit(s[i]);
        if (h < 0) return false;
        v = v << 4 | (uint64_t)h;
    }
    *id = v;
    return true;
}

int spool_data_create(stage *st, uint64_t *id) {
    for (;;) {
        char name[17];
        uint64_t n = st->next_id++;
        spool_data_name(n, name);
        int fd = openat(st->data_fd, name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd >= 0) {
            *id = n;
            return fd;
        }
        if (errno != EEXIST) return -errno;
    }
}

int spool_data_open(const stage *st, uint64_t id) {
    char name[17];
    spool_data_name(id, name);
    int fd = openat(st->data_fd, name, O_RDWR | O_CLOEXEC);
    return fd >= 0 ? fd : -errno;
}

int spool_data_stat(const stage *st, uint64_t id, struct stat *s) {
    char name[17];
    spool_data_name(id, name);
    return fstatat(st->data_fd, name, s, 0) == 0 ? 0 : -errno;
}

void spool_data_unlink(const stage *st, uint64_t id) {
    char name[17];
    spool_data_name(id, name);
    unlinkat(st->data_fd, name, 0);
}

/* ---- the source's tree ---- */

static int add_lower_file(stage *st, const char *path, sn_src src, size_t tensor, uint64_t size,
                          struct timespec mtime) {
    snode *dir = st->root;
    const char *p = path;
    for (const char *slash; (slash = strchr(p, '/')); p = slash + 1) {
        dir = tree_ensure_dir(dir, p, (size_t)(slash - p));
        if (!dir) return -1;
    }
    if (tree_child(dir, p, strlen(p))) return -1;
    snode *f = snode_new(SN_FILE, p, strlen(p), 0644);
    if (!f || tree_attach(dir, f) != 0) {
        snode_free(f);
        return -1;
    }
    f->src = src;
    f->lower = tensor;
    f->lower_size = size;
    f->mtime = mtime;
    return 0;
}

/* The source's tensors as a mount shows them: raw file + sidecar. Tensors set aside from the
 * model (optimizer state, per-rank copies) and anything under .ckptfs/ are not staged. */
static int populate_lower(stage *st, hashmap *by_path) {
    const ckpt_catalog *cat = st->lower;
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        if (t->aside || strncmp(t->path, ".ckptfs/", 8) == 0) continue;
        struct timespec mtime = {0};
        if (t->npieces) mtime = cat->sources[t->pieces[0].source].mtime;
        size_t side_len = 0;
        char *side = ckpt_sidecar_json(cat, t, &side_len);
        if (!side) return -ENOMEM;
        free(side);
        char *side_path = ckpt_sidecar_path(t);
        if (!side_path) return -ENOMEM;
        int rc = add_lower_file(st, t->path, SRC_LOWER_RAW, i, t->nbytes, mtime);
        if (!rc) rc = add_lower_file(st, side_path, SRC_LOWER_SIDECAR, i, side_len, mtime);
        free(side_path);
        if (rc != 0) {
            msg_error("stage", "%s: tensor path %s cannot be staged (skipped)", st->from, t->path);
            continue;
        }
        bool added; /* sidecars are found by their tensor's path (lower_file) */
        if (!hm_put(by_path, t->path, strlen(t->path), i, &added)) return -ENOMEM;
    }
    return 0;
}

/* ---- garbage ---- */

static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return w < 0 ? -errno : -ENOSPC;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* A Hugging Face folder's own files (config.json, tokenizer files): copied into the spool at
 * the top of the tree when a stage begins, so they travel into a directory OUT and can be
 * edited like any staged file. They are small; the source is never modified. */
static int populate_aux(stage *st) {
    const ckpt_catalog *cat = st->lower;
    char *buf = malloc(1 << 20);
    int rc = buf ? 0 : -ENOMEM;
    for (size_t i = 0; !rc && i < cat->naux; i++) {
        const char *name = cat->aux[i].name;
        const ckpt_source *s = &cat->sources[cat->aux[i].source];
        if (strchr(name, '/') || tree_child(st->root, name, strlen(name))) continue;
        uint64_t id;
        int fd = spool_data_create(st, &id);
        if (fd < 0) {
            rc = fd;
            break;
        }
        for (uint64_t off = 0; !rc && off < s->size;) {
            ssize_t n = ckpt_source_pread(s, buf, 1 << 20, off);
            if (n <= 0) rc = n < 0 ? (int)n : -EIO;
            if (!rc) rc = write_all(fd, buf, (size_t)n);
            off += n > 0 ? (uint64_t)n : 0;
        }
        close(fd);
        snode *f = rc ? NULL : snode_new(SN_FILE, name, strlen(name), 0644);
        if (!rc && (!f || tree_attach(st->root, f) != 0)) {
            snode_free(f);
            rc = -ENOMEM;
        }
        if (rc) {
            spool_data_unlink(st, id);
            msg_error("stage", "%s: cannot copy it into the spool: %s", s->path, strerror(-rc));
            break;
        }
        f->src = SRC_SPOOL;
        f->data_id = id;
        f->mtime = s->mtime;
    }
    free(buf);
    return rc;
}

/* Writes name (temporary + fsync + rename) in the spool. */
int spool_write_file(stage *st, const char *name, const char *text, size_t len) {
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%s.new", name);
    int fd = openat(st->spool_fd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -errno;
    int rc = write_all(fd, text, len);
    if (!rc && fsync(fd) != 0) rc = -errno;
    close(fd);
    if (!rc && renameat(st->spool_fd, tmp, st->spool_fd, name) != 0) rc = -errno;
    if (rc) unlinkat(st->spool_fd, tmp, 0);
    if (!rc) fsync(st->spool_fd);
    return rc;
}

/* A listing of data/ (from its start: a dup shares the offset of earlier listings). */
static DIR *open_data_dir(const stage *st) {
    int fd = dup(st->data_fd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d && fd >= 0) close(fd);
    if (d) rewinddir(d);
    return d;
}

typedef struct idset {
    uint64_t *ids;
    size_t n, cap;
    bool incomplete; /* out of memory: then nothing can be proven unused */
} idset;

static void collect_ids(const snode *n, idset *s) {
    for (size_t b = 0; b < n->nbuckets; b++)
        for (const snode *c = n->buckets[b]; c; c = c->hash_next) {
            if (c->kind == SN_DIR) collect_ids(c, s);
            if (c->kind != SN_FILE || (c->src != SRC_SPOOL && c->src != SRC_PACK)) continue;
            if (GROW(s->ids, s->cap, s->n + 1)) {
                s->incomplete = true;
                continue;
            }
            s->ids[s->n++] = c->data_id;
        }
}

static int id_cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Removes data files no node refers to and sets next_id past every id in use. */
static void collect_garbage(stage *st, bool remove_unused) {
    idset s = {0};
    collect_ids(st->root, &s);
    if (s.n) qsort(s.ids, s.n, sizeof *s.ids, id_cmp);
    uint64_t next = s.n ? s.ids[s.n - 1] + 1 : 0;
    DIR *d = open_data_dir(st);
    for (struct dirent *e; d && (e = readdir(d));) {
        uint64_t id;
        if (!spool_parse_id(e->d_name, &id)) continue;
        if (id >= next) next = id + 1;
        bool used = s.n && bsearch(&id, s.ids, s.n, sizeof *s.ids, id_cmp) != NULL;
        if (!used && remove_unused && !s.incomplete) unlinkat(st->data_fd, e->d_name, 0);
    }
    if (d) closedir(d);
    st->next_id = next;
    free(s.ids);
}

/* A commit killed half-way leaves OUT's temporary beside it: ".NAME.partial-XXXXXX", a file,
 * or for an HF directory a directory of that name (core/write/writer.c names both). The stage that
 * takes over removes it. Only regular files are removed from such a directory: a subdirectory
 * in it is a user's, moved there by a commit that replaced OUT (core/writer_dir.c). */
static void remove_stale_partials(const stage *st) {
    char *copy = strdup(st->out), *copy2 = strdup(st->out);
    if (!copy || !copy2) {
        free(copy);
        free(copy2);
        return;
    }
    size_t n = strlen(copy);
    while (n > 1 && copy[n - 1] == '/') copy[--n] = '\0';
    strcpy(copy2, copy);
    const char *dir = dirname(copy), *base = basename(copy2);
    char prefix[NAME_MAX + 16];
    snprintf(prefix, sizeof prefix, ".%s.partial-", base);
    size_t plen = strlen(prefix);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!d && dfd >= 0) close(dfd);
    for (struct dirent *e; d && (e = readdir(d));) {
        struct stat s;
        if (strncmp(e->d_name, prefix, plen) != 0 || strlen(e->d_name) != plen + 6 ||
            fstatat(dirfd(d), e->d_name, &s, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        if (S_ISREG(s.st_mode) && unlinkat(dirfd(d), e->d_name, 0) == 0)
            msg_error("stage", "removed %s/%s, left by a commit that did not finish", dir,
                      e->d_name);
        if (!S_ISDIR(s.st_mode)) continue;
        int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        DIR *sd = sub >= 0 ? fdopendir(sub) : NULL;
        if (!sd && sub >= 0) close(sub);
        for (struct dirent *f; sd && (f = readdir(sd));) {
            struct stat fs;
            if (fstatat(dirfd(sd), f->d_name, &fs, AT_SYMLINK_NOFOLLOW) == 0 &&
                !S_ISDIR(fs.st_mode))
                unlinkat(dirfd(sd), f->d_name, 0);
        }
        if (sd) closedir(sd);
        if (unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR) == 0)
            msg_error("stage", "removed %s/%s/, left by a commit that did not finish", dir,
                      e->d_name);
        else
            msg_error("stage",
                      "%s/%s/, left by a commit that did not finish, holds "
                      "directories: look at it and remove it",
                      dir, e->d_name);
    }
    if (d) closedir(d);
    free(copy);
    free(copy2);
}

/* ---- state ---- */

static void put_fingerprint(strbuf *sb, const ckpt_catalog *cat) {
    for (uint32_t i = 0; cat && i < cat->nsources; i++) {
        const ckpt_source *s = &cat->sources[i];
        sb_puts(sb, "source ");
        text_pct_escape(sb, s->relpath, strlen(s->relpath), true);
        sb_printf(sb, " %llu %lld %ld\n", (unsigned long long)s->size, (long long)s->mtime.tv_sec,
                  (long)s->mtime.tv_nsec);
    }
}

int spool_write_state(stage *st) {
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, STATE_HEADER "\nout ");
    text_pct_escape(&sb, st->out, strlen(st->out), true);
    sb_puts(&sb, "\nfrom ");
    if (st->from)
        text_pct_escape(&sb, st->from, strlen(st->from), true);
    else
        sb_putc(&sb, '-');
    sb_putc(&sb, '\n');
    put_fingerprint(&sb, st->lower);
    int rc = sb.failed ? -ENOMEM : spool_write_file(st, "state", sb.data, sb.len);
    sb_free(&sb);
    return rc;
}

typedef struct saved_state {
    char *out, *from; /* decoded; from NULL for "-" */
    char *fingerprint;
} saved_state;

static int read_state(stage *st, saved_state *s) {
    memset(s, 0, sizeof *s);
    int fd = openat(st->spool_fd, "state", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    FILE *in = fdopen(fd, "r");
    if (!in) {
        close(fd);
        return -ENOMEM;
    }
    char *line = NULL;
    size_t cap = 0, len;
    ssize_t n;
    int rc = 0, lineno = 0;
    strbuf fp;
    sb_init(&fp);
    while ((n = getline(&line, &cap, in)) > 0) {
        if (line[n - 1] == '\n') line[--n] = '\0';
        if (lineno++ == 0) {
            if (strcmp(line, STATE_HEADER) != 0) rc = -EINVAL;
            if (rc) break;
            continue;
        }
        if (strncmp(line, "out ", 4) == 0) {
            free(s->out);
            s->out = strdup(line + 4);
            if (s->out) text_pct_unescape(s->out, &len, false);
        } else if (strncmp(line, "from ", 5) == 0) {
            free(s->from);
            s->from = strcmp(line + 5, "-") == 0 ? NULL : strdup(line + 5);
            if (s->from) text_pct_unescape(s->from, &len, false);
        } else if (strncmp(line, "source ", 7) == 0) {
            sb_puts(&fp, line);
            sb_putc(&fp, '\n');
        }
    }
    free(line);
    fclose(in);
    if (!rc && !s->out) rc = -EINVAL;
    s->fingerprint = sb_take(&fp, NULL);
    return rc;
}

static void free_state(saved_state *s) {
    free(s->out);
    free(s->from);
    free(s->fingerprint);
}

/* ---- a commit over its own source ---- */

int spool_note_landing(stage *st, const struct stat *what) {
    char text[64];
    int n = snprintf(text, sizeof text, "%llu %llu\n", (unsigned long long)what->st_dev,
                     (unsigned long long)what->st_ino);
    return spool_write_file(st, "landing", text, (size_t)n);
}

void spool_clear_landing(stage *st) {
    if (unlinkat(st->spool_fd, "landing", 0) == 0) fsync(st->spool_fd);
}

/* A stage --from OUT itself (stage_replaces_source, which this file does not call: the
 * rebase depends on the journal, which depends on the spool). */
static bool over_own_out(const stage *st) {
    if (!st->from || !st->lower) return false;
    size_t a = strlen(st->from), b = strlen(st->out);
    while (a > 1 && st->from[a - 1] == '/') a--;
    while (b > 1 && st->out[b - 1] == '/') b--;
    return a == b && memcmp(st->from, st->out, a) == 0;
}

/* Whether OUT is now what SPOOL/landing names: the killed commit put it in place. */
static bool commit_landed(const stage *st) {
    char text[64] = "";
    int fd = openat(st->spool_fd, "landing", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    text[n > 0 ? n : 0] = '\0';
    unsigned long long dev, ino;
    char out[PATH_MAX];
    size_t len = strlen(st->out);
    while (len > 1 && st->out[len - 1] == '/') len--;
    snprintf(out, sizeof out, "%.*s", (int)len, st->out);
    struct stat s;
    return sscanf(text, "%llu %llu", &dev, &ino) == 2 && stat(out, &s) == 0 &&
           (unsigned long long)s.st_dev == dev && (unsigned long long)s.st_ino == ino;
}

/* ---- setup ---- */

/* The report of the last commit, for .ckptfs/status after a restart. */
static void load_last_report(stage *st) {
    int fd = openat(st->spool_fd, "last-commit", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    strbuf sb;
    sb_init(&sb);
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0 && sb.len < (1u << 20)) sb_put(&sb, buf, (size_t)n);
    close(fd);
    free(st->last_report);
    st->last_report = sb_take(&sb, NULL);
}

static int take_lock(stage *st) {
    st->lock_fd = openat(st->spool_fd, "lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (st->lock_fd < 0) {
        msg_error("stage", "%s/lock: %s", st->spool, strerror(errno));
        return STAGE_INVALID;
    }
    if (flock(st->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        char pid[32] = "";
        ssize_t r = pread(st->lock_fd, pid, sizeof pid - 1, 0);
        pid[r > 0 ? r : 0] = '\0';
        pid[strcspn(pid, "\n")] = '\0';
        msg_error("stage",
                  "%s is already being staged by another ckptfs%s%s%s "
                  "(spool %s)",
                  st->out, pid[0] ? " (pid " : "", pid, pid[0] ? ")" : "", st->spool);
        return STAGE_INVALID;
    }
    return 0;
}

void spool_note_outcome(stage *st, const char *what, int status) {
    char line[64];
    int n = snprintf(line, sizeof line, "%s %d\n", what, status);
    if (st->lock_fd >= 0 && ftruncate(st->lock_fd, 0) == 0 &&
        pwrite(st->lock_fd, line, (size_t)n, 0) == n)
        fdatasync(st->lock_fd);
}

void spool_note_pid(stage *st) {
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(st->lock_fd, 0) == 0 && pwrite(st->lock_fd, pid, (size_t)n, 0) != n) {
        /* only informative */
    }
}

static int open_source(stage *st) {
    if (!st->from) return 0;
    ckpt_err err = {{0}};
    if (ckpt_open(st->from, NULL, &st->lower, &err) != 0) {
        msg_error("stage", "--from %s", err.msg);
        return STAGE_INVALID;
    }
    return 0;
}

static int setup(stage *st, const char *from_arg, bool *resumed, bool *fresh,
                 hashmap *lower_paths) {
    st->spool_fd = st->data_fd = st->lock_fd = st->journal_fd = -1;
    if (mkdir(st->spool, 0700) != 0 && errno != EEXIST) {
        msg_error("stage", "cannot create the spool %s: %s", st->spool, strerror(errno));
        return STAGE_INVALID;
    }
    st->spool_fd = open(st->spool, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (st->spool_fd < 0) {
        msg_error("stage", "spool %s: %s", st->spool, strerror(errno));
        return STAGE_INVALID;
    }
    int rc = take_lock(st);
    if (rc) return rc;
    struct stat state;
    *fresh = fstatat(st->spool_fd, "state", &state, 0) != 0 && errno == ENOENT;
    if (mkdirat(st->spool_fd, "data", 0700) != 0 && errno != EEXIST) {
        msg_error("stage", "%s/data: %s", st->spool, strerror(errno));
        return STAGE_INVALID;
    }
    st->data_fd = openat(st->spool_fd, "data", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (st->data_fd < 0) {
        msg_error("stage", "%s/data: %s", st->spool, strerror(errno));
        return STAGE_INVALID;
    }

    saved_state saved;
    int sr = read_state(st, &saved);
    *resumed = sr == 0;
    if (sr != 0 && sr != -ENOENT) {
        msg_error("stage", "%s/state: not a ckptfs stage state file%s%s", st->spool,
                  sr == -EINVAL ? "" : ": ", sr == -EINVAL ? "" : strerror(-sr));
        free_state(&saved);
        return STAGE_INVALID;
    }
    if (*resumed) {
        if (strcmp(saved.out, st->out) != 0) {
            msg_error("stage", "the spool %s stages %s, not %s", st->spool, saved.out, st->out);
            free_state(&saved);
            return STAGE_INVALID;
        }
        if (st->from && (!saved.from || strcmp(saved.from, st->from) != 0)) {
            msg_error("stage",
                      "the spool %s holds a stage %s%s, not over --from %s "
                      "(leave out --from to continue it, or remove the spool to start over)",
                      st->spool, saved.from ? "over " : "started empty",
                      saved.from ? saved.from : "", from_arg);
            free_state(&saved);
            return STAGE_INVALID;
        }
        if (!st->from && saved.from) st->from = strdup(saved.from);
    }
    rc = open_source(st);
    if (!rc && *resumed) {
        strbuf now;
        sb_init(&now);
        put_fingerprint(&now, st->lower);
        const char *was = saved.fingerprint ? saved.fingerprint : "";
        bool changed = strcmp(now.data ? now.data : "", was) != 0;
        if (changed && over_own_out(st) && commit_landed(st)) {
            /* OUT holds the staged tree: nothing is left to replay. The journal goes first,
             * so that a kill from here on finds the same (old state, landing, no journal). */
            msg_error("stage",
                      "the last commit of %s was cut short after it put OUT in "
                      "place: the stage goes on over it",
                      st->out);
            unlinkat(st->spool_fd, "journal", 0);
            fsync(st->spool_fd);
            *resumed = false;
            st->landed = true;
            changed = false;
        }
        if (changed) {
            msg_error("stage",
                      "the source %s changed since this stage began (sizes "
                      "or times of its files differ); the staged changes refer to the old files. "
                      "Restore it, or remove the spool %s to start over",
                      st->from, st->spool);
            rc = STAGE_INVALID;
        }
        sb_free(&now);
    }
    free_state(&saved);
    if (rc) return rc;
    if (!*resumed && spool_write_state(st) != 0) {
        msg_error("stage", "cannot write %s/state: %s", st->spool, strerror(errno));
        return STAGE_INVALID;
    }
    spool_clear_landing(st); /* the state names the source as it is now */

    st->root = snode_new(SN_DIR, "", 0, 0755);
    if (!st->root || !hm_init(lower_paths, st->lower ? st->lower->ntensors : 1)) {
        msg_error("stage", "out of memory");
        return STAGE_INVALID;
    }
    rc = st->lower ? populate_lower(st, lower_paths) : 0;
    if (!rc && st->lower && !*resumed) rc = populate_aux(st);
    /* a new overlay is a change: unmounting it writes OUT */
    st->dirty = !*resumed && st->lower && !st->landed;
    if (rc) {
        hm_free(lower_paths);
        if (rc == -ENOMEM) msg_error("stage", "out of memory");
        return STAGE_INVALID;
    }
    return 0;
}

int spool_setup(stage *st, const char *from_arg, bool *resumed, hashmap *lower_paths) {
    bool fresh = false;
    *resumed = false;
    int rc = setup(st, from_arg, resumed, &fresh, lower_paths);
    /* A spool made just now holds nothing yet: a stage that could not start leaves none. */
    if (rc && fresh) spool_remove(st);
    return rc;
}

void spool_tidy(stage *st, bool resumed) {
    collect_garbage(st, true);
    if (resumed || st->landed) {
        remove_stale_partials(st);
        load_last_report(st);
    }
}

void spool_close(stage *st) {
    int *fds[] = {&st->journal_fd, &st->data_fd, &st->spool_fd, &st->lock_fd};
    for (size_t i = 0; i < sizeof fds / sizeof *fds; i++)
        if (*fds[i] >= 0) {
            close(*fds[i]);
            *fds[i] = -1;
        }
}

void spool_remove(stage *st) {
    DIR *d = open_data_dir(st);
    for (struct dirent *e; d && (e = readdir(d));) {
        uint64_t id;
        if (spool_parse_id(e->d_name, &id)) unlinkat(st->data_fd, e->d_name, 0);
    }
    if (d) closedir(d);
    unlinkat(st->spool_fd, "data", AT_REMOVEDIR);
    static const char *const files[] = {"journal",   "journal.new", "state",
                                        "state.new", "last-commit", "last-commit.new",
                                        "landing",   "landing.new", "lock"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) unlinkat(st->spool_fd, files[i], 0);
    rmdir(st->spool); /* only if nothing else is in it */
}
