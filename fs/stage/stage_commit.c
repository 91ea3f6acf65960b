/* Commit: the staged tree is listed, checked and packed into OUT by ckpt_write (temporary file
 * in OUT's directory, fsync, rename), while changes to the tree are refused (EBUSY). A failed
 * commit leaves OUT as it was and the spool as it is.
 *
 * The report ("exit N", a summary line, then one line per problem) is what `ckptfs commit`
 * prints; it is kept in memory for .ckptfs/status and in SPOOL/last-commit for after a
 * restart. */
#include "stage_fs.h"
#include "stage_pack.h"

#include "core/util/arena.h"
#include "core/write/staged.h"
#include "core/write/writer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct listing {
    staged_file *files;
    snode **nodes; /* the node of each file */
    size_t n, cap;
    arena mem;
    bool failed;
} listing;

static void list_node(stage *st, const snode *dir, listing *l, strbuf *path) {
    size_t at = path->len;
    for (size_t b = 0; b < dir->nbuckets && !l->failed; b++)
        for (const snode *c = dir->buckets[b]; c && !l->failed; c = c->hash_next) {
            path->len = at;
            if (at) sb_putc(path, '/');
            sb_put(path, c->name, c->name_len);
            if (path->failed) {
                l->failed = true;
                break;
            }
            if (c->kind == SN_DIR) {
                list_node(st, c, l, path);
                continue;
            }
            if (l->n == l->cap) {
                size_t cap = l->cap ? l->cap * 2 : 256;
                staged_file *f = realloc(l->files, cap * sizeof *f);
                if (f) l->files = f;
                snode **nodes = f ? realloc(l->nodes, cap * sizeof *nodes) : NULL;
                if (!nodes) {
                    l->failed = true;
                    break;
                }
                l->nodes = nodes;
                l->cap = cap;
            }
            l->nodes[l->n] = (snode *)c;
            staged_file *f = &l->files[l->n];
            memset(f, 0, sizeof *f);
            f->path = arena_memdup(&l->mem, path->data, path->len);
            f->lower = c->lower;
            if (c->src == SRC_PACK) {
                f->origin = STAGED_SPOOL;
                strbuf sp;
                sb_init(&sp);
                spool_data_path(st, c->data_id, &sp);
                f->spool_path = sp.failed ? NULL : arena_memdup(&l->mem, sp.data, sp.len);
                sb_free(&sp);
                f->size = c->pack_size;
                f->spool_offset = c->pack_off;
                if (!f->spool_path) l->failed = true;
            } else if (c->src == SRC_SPOOL) {
                f->origin = STAGED_SPOOL;
                strbuf sp;
                sb_init(&sp);
                struct stat s;
                spool_data_path(st, c->data_id, &sp);
                f->spool_path = sp.failed ? NULL : arena_memdup(&l->mem, sp.data, sp.len);
                sb_free(&sp);
                f->size = spool_data_stat(st, c->data_id, &s) == 0 ? (uint64_t)s.st_size : 0;
                if (!f->spool_path) l->failed = true;
            } else {
                f->origin = c->src == SRC_LOWER_RAW ? STAGED_LOWER_RAW : STAGED_LOWER_SIDECAR;
            }
            if (!f->path) l->failed = true;
            l->n++;
        }
    path->len = at;
}

static void progress(void *ctx, uint64_t done, uint64_t total) {
    stage *st = ctx;
    atomic_store(&st->progress_total, total);
    atomic_store(&st->progress_done, done);
}

static void put_lines(strbuf *sb, char *const *lines, size_t n, const char *prefix) {
    for (size_t i = 0; i < n; i++) {
        sb_puts(sb, prefix);
        sb_puts(sb, lines[i]);
        sb_putc(sb, '\n');
    }
}

/* A stage --from OUT written whole, or as a directory of packs: what becomes OUT is recorded
 * before it is put in place, as a single file's pack does itself (pack_publish), so that a
 * stage taken up after a kill between that rename and the rebase knows the new OUT as its
 * own. */
static int landing_before_publish(void *ctx, const char *tmp_path) {
    return note_landing(ctx, -1, tmp_path);
}

void stage_own_ctime_change(stage *st, ckpt_catalog *cat, bool begin) {
    ckpt_catalog *each[2] = {st->lower, cat};
    for (size_t c = 0; c < 2 + st->nretired; c++) {
        ckpt_catalog *k = c < 2 ? each[c] : st->retired[c - 2];
        for (uint32_t i = 0; k && i < k->nsources; i++)
            if (begin)
                ckpt_source_own_ctime_begin(&k->sources[i]);
            else
                ckpt_source_own_ctime_end(&k->sources[i]);
    }
}

static int check_and_write(stage *st, listing *l, strbuf *report) {
    ckpt_catalog *cat = NULL;
    staged_report rep;
    ckpt_err err = {{0}};
    int rc = staged_build(l->files, l->n, st->lower, st->mountpoint, &cat, &rep, &err);
    int status;
    if (rc == -EINVAL) {
        status = STAGE_INVALID;
        sb_printf(report,
                  "exit %d\n%zu problem%s in the staged tree; %s was not written, the "
                  "staged files are kept\n",
                  status, rep.nproblems, rep.nproblems == 1 ? "" : "s", st->out);
        put_lines(report, rep.problems, rep.nproblems, "");
    } else if (rc) {
        status = STAGE_WRITE_FAILED;
        sb_printf(report,
                  "exit %d\ncannot check the staged tree: %s\n%s was not written, the "
                  "staged files are kept\n",
                  status, err.msg, st->out);
    } else {
        ckpt_write_opts opts = {.max_shard_size = st->max_shard_size,
                                .replace_dir = true, /* every commit replaces OUT */
                                /* --from OUT: the stage moves onto what it wrote */
                                .replaces_own_source = stage_replaces_source(st),
                                .progress = {.report = progress, .ctx = st}};
        if (opts.replaces_own_source) {
            opts.before_publish = landing_before_publish;
            opts.publish_ctx = st;
        }
        atomic_store(&st->progress_total, rep.nbytes);
        stage_own_ctime_change(st, cat, true);
        /* Into the pack when its tensors tile it; else written whole (the compaction) */
        rc = stage_pack_commit(st, cat, &opts, &err);
        if (rc == 1) rc = ckpt_write(cat, st->out, &opts, &err);
        stage_own_ctime_change(st, cat, false); /* before the rebase reads the old source again */
        if (rc) {
            pthread_mutex_lock(&st->lock);
            spool_clear_landing(st); /* OUT was not replaced */
            pthread_mutex_unlock(&st->lock);
            /* EINVAL: what is staged cannot be held by OUT's format (a dtype, a name) */
            status = rc == -EINVAL ? STAGE_INVALID : STAGE_WRITE_FAILED;
            sb_printf(report, "exit %d\n%s\n%s was not changed, the staged files are kept\n",
                      status, err.msg, st->out);
        } else {
            status = STAGE_OK;
            sb_printf(report, "exit 0\nwrote %s: %zu tensor%s, %llu bytes\n", st->out, rep.ntensors,
                      rep.ntensors == 1 ? "" : "s", (unsigned long long)rep.nbytes);
            if (stage_replaces_source(st)) {
                pthread_mutex_lock(&st->lock);
                /* once the state names the new OUT; else a stage taken up after a kill still
                 * needs the landing to know OUT as its own */
                if (stage_rebase(st, l->nodes, l->n, &rep, report) == 0) spool_clear_landing(st);
                pthread_mutex_unlock(&st->lock);
            }
        }
    }
    put_lines(report, rep.notes, rep.nnotes, "note: ");
    size_t n = strlen(st->out);
    for (size_t i = 0; status == STAGE_OK && cat && n && st->out[n - 1] != '/' && i < cat->naux;
         i++)
        sb_printf(report,
                  "note: %s: not written: %s is one file (a directory OUT/ carries a Hugging "
                  "Face folder's own files)\n",
                  cat->aux[i].name, st->out);
    staged_report_free(&rep);
    ckpt_close(cat);
    return status;
}

int stage_commit(stage *st, char **report_out) {
    pthread_mutex_lock(&st->commit_lock);
    pthread_rwlock_wrlock(&st->gate);
    atomic_store(&st->committing, true);
    atomic_store(&st->progress_done, 0);
    atomic_store(&st->progress_total, 0);

    listing l = {0};
    arena_init(&l.mem);
    strbuf path, report;
    sb_init(&path);
    sb_init(&report);
    pthread_mutex_lock(&st->lock);
    list_node(st, st->root, &l, &path);
    pthread_mutex_unlock(&st->lock);
    sb_free(&path);

    int status;
    if (l.failed) {
        status = STAGE_WRITE_FAILED;
        sb_printf(&report, "exit %d\nout of memory listing the staged tree\n", status);
    } else {
        status = check_and_write(st, &l, &report);
    }
    free(l.files);
    free(l.nodes);
    arena_free(&l.mem);

    pthread_mutex_lock(&st->lock);
    if (status == STAGE_OK) {
        /* OUT now holds the staged tree; a replay after a crash must know. */
        if (journal_mark(st, 'C') == 0 && journal_sync(st) == 0) st->dirty = false;
    }
    char *text = sb_take(&report, NULL);
    free(st->last_report);
    st->last_report = text ? strdup(text) : NULL;
    if (text) spool_write_file(st, "last-commit", text, strlen(text));
    pthread_mutex_unlock(&st->lock);

    atomic_store(&st->committing, false);
    pthread_rwlock_unlock(&st->gate);
    pthread_mutex_unlock(&st->commit_lock);
    *report_out = text;
    return status;
}

static void put_json_str(strbuf *sb, const char *s) {
    if (s)
        sb_json_str(sb, s, strlen(s));
    else
        sb_puts(sb, "null");
}

char *stage_status_json(stage *st, size_t *len) {
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "{\n  \"out\": ");
    put_json_str(&sb, st->out);
    sb_puts(&sb, ",\n  \"from\": ");
    put_json_str(&sb, st->from);
    sb_puts(&sb, ",\n  \"spool\": ");
    put_json_str(&sb, st->spool);
    sb_puts(&sb, ",\n  \"mountpoint\": ");
    put_json_str(&sb, st->mountpoint);
    bool committing = atomic_load(&st->committing);
    sb_printf(&sb, ",\n  \"state\": \"%s\",\n  \"changed_since_commit\": %s,\n",
              committing ? "committing" : "idle", st->dirty ? "true" : "false");
    sb_printf(&sb, "  \"progress\": {\"done\": %llu, \"total\": %llu},\n  \"last_commit\": ",
              (unsigned long long)atomic_load(&st->progress_done),
              (unsigned long long)atomic_load(&st->progress_total));
    pthread_mutex_lock(&st->lock);
    const char *r = st->last_report;
    int status;
    if (r && sscanf(r, "exit %d", &status) == 1) {
        sb_printf(&sb, "{\"exit_status\": %d, \"report\": [", status);
        const char *line = strchr(r, '\n');
        bool first = true;
        while (line && line[1]) {
            line++;
            const char *end = strchr(line, '\n');
            size_t n = end ? (size_t)(end - line) : strlen(line);
            sb_puts(&sb, first ? "\n    " : ",\n    ");
            sb_json_str(&sb, line, n);
            first = false;
            line = end;
        }
        sb_puts(&sb, first ? "]}" : "\n  ]}");
    } else {
        sb_puts(&sb, "null");
    }
    pthread_mutex_unlock(&st->lock);
    sb_puts(&sb, "\n}\n");
    return sb_take(&sb, len);
}
