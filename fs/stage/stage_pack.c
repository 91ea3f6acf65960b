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
 * A commit whose tensors in the pack tile it from PACK_DATA_START without a gap appends the
 * other tensors (from the source, from data files, from older packs: copy_file_range, which
 * reflinks where the file system can), writes the header in front (padded with spaces up to
 * the data, as the format allows), fsyncs, and links the pack as OUT (a new name, renamed over
 * OUT). OUT and data/ID are then one file; the stage appends to a new pack from there on. A
 * pack with holes (files removed, rewritten or truncated after they were written), or whose
 * header does not fit, is committed by ckpt_write as before: the compaction is that copy. */
#include "stage_pack.h"

#include "core/hfview.h"
#include "core/pwrite_pieces.h"
#include "core/text.h"
#include "core/writer.h"
#include "core/utf8.h"
#include "core/writer.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Files that cannot be a tensor's raw bytes would leave holes between tensors. */
bool stage_pack_name_ok(const char *name) {
    if (name[0] == '.' || str_ends_with(name, ".json") || str_ends_with(name, ".npy")) return false;
    for (size_t i = 0; i < hf_aux_count; i++)
        if (strcmp(name, hf_aux_names[i]) == 0) return false;
    return true;
}

/* A safetensors OUT, or an HF directory OUT, on the file system of the spool (a link cannot
 * cross). */
int stage_pack_mode(stage *st) {
    if (st->pack_usable) return st->pack_usable;
    st->pack_usable = PACK_NONE;
    char copy[PATH_MAX];
    snprintf(copy, sizeof copy, "%s", st->out);
    size_t n = strlen(copy);
    bool slash = n > 1 && copy[n - 1] == '/';
    while (n > 1 && copy[n - 1] == '/') copy[--n] = '\0';
    struct stat out, dir, data;
    bool is_dir = slash || st->max_shard_size || (stat(copy, &out) == 0 && S_ISDIR(out.st_mode));
    int mode = is_dir ? PACK_DIR : str_ends_with(copy, ".safetensors") ? PACK_FILE : PACK_NONE;
    if (mode == PACK_NONE) return st->pack_usable;
    if (stat(dirname(copy), &dir) == 0 && fstat(st->data_fd, &data) == 0 &&
        dir.st_dev == data.st_dev)
        st->pack_usable = mode;
    return st->pack_usable;
}

static uint64_t max_shard(const stage *st) {
    return st->max_shard_size ? st->max_shard_size : CKPT_HF_MAX_SHARD_DEFAULT;
}

static int open_new_pack(stage *st) {
    uint64_t id;
    int fd = spool_data_create(st, &id);
    if (fd < 0) return -fd;
    if (ftruncate(fd, PACK_DATA_START) != 0) {
        int e = errno;
        close(fd);
        spool_data_unlink(st, id);
        return e;
    }
    st->pack_fd = fd;
    st->pack_id = id;
    st->pack_end = PACK_DATA_START;
    return 0;
}

int stage_pack_claim(stage *st, snode *n, const char *name) {
    int mode = stage_pack_mode(st);
    if (mode == PACK_NONE || st->pack_tail || !stage_pack_name_ok(name)) return ENOTSUP;
    /* a directory OUT: a pack is a shard; a full one is left for the next */
    if (mode == PACK_DIR && st->pack_fd >= 0 && st->pack_end - PACK_DATA_START >= max_shard(st)) {
        close(st->pack_fd);
        st->pack_fd = -1;
    }
    if (st->pack_fd < 0 && open_new_pack(st) != 0) return ENOTSUP;
    int fd = dup(st->pack_fd);
    if (fd < 0) return ENOTSUP;
    sn_src was = n->src;
    n->src = SRC_PACK;
    n->data_id = st->pack_id;
    n->pack_off = st->pack_end;
    n->pack_size = 0;
    n->late_error = 0;
    int e = -journal_pack(st, n);
    if (e) {
        n->src = was;
        close(fd);
        return e;
    }
    if (n->fd >= 0) close(n->fd);
    n->fd = fd;
    st->pack_tail = n;
    return 0;
}

void stage_pack_seal(stage *st) {
    snode *n = st->pack_tail;
    if (!n) return;
    st->pack_tail = NULL;
    if (!n->removed) journal_pack_size(st, n); /* a failure leaves "ends where the pack ends" */
}

void stage_pack_drop_tail(stage *st, snode *n) {
    bool last =
        n == st->pack_tail || (!st->pack_tail && n->src == SRC_PACK && n->data_id == st->pack_id &&
                               n->pack_off + n->pack_size == st->pack_end);
    if (!last || st->pack_fd < 0) return;
    if (ftruncate(st->pack_fd, (off_t)n->pack_off) == 0) st->pack_end = n->pack_off;
    st->pack_tail = NULL;
}

bool stage_pack_writable(const stage *st, const snode *n) {
    return n->src == SRC_PACK && n == st->pack_tail;
}

void stage_pack_grew(stage *st, snode *n, uint64_t end) {
    if (n->src != SRC_PACK || end <= n->pack_size) return;
    n->pack_size = end;
    if (n == st->pack_tail) st->pack_end = n->pack_off + end;
}

/* ---- commit ---- */

int placed_cmp(const void *a, const void *b) {
    uint64_t x = ((const placed *)a)->off, y = ((const placed *)b)->off;
    return (x > y) - (x < y);
}

int pack_width_cmp(const void *a, const void *b, void *ctx) {
    const ckpt_catalog *cat = ctx;
    const ckpt_tensor *x = &cat->tensors[*(const size_t *)a],
                      *y = &cat->tensors[*(const size_t *)b];
    unsigned wx = ckpt_dtype_elem_size(x->dtype), wy = ckpt_dtype_elem_size(y->dtype);
    return (wx < wy) - (wx > wy);
}

bool pack_fits_safetensors(const ckpt_tensor *t) {
    return ckpt_dtype_info_of(t->dtype)->safetensors && !t->incomplete &&
           utf8_invalid_at(t->name, t->name_len) == t->name_len &&
           !ckpt_safetensors_reserved_name(t->name, t->name_len);
}

uint64_t pack_live_end(const snode *dir, uint64_t id) {
    uint64_t end = 0;
    for (size_t b = 0; b < dir->nbuckets; b++)
        for (const snode *c = dir->buckets[b]; c; c = c->hash_next) {
            uint64_t e = c->kind == SN_DIR                        ? pack_live_end(c, id)
                         : c->src == SRC_PACK && c->data_id == id ? c->pack_off + c->pack_size
                                                                  : 0;
            if (e > end) end = e;
        }
    return end;
}

int pack_pwrite_all(int fd, const void *p, size_t n, uint64_t at) {
    return -pwrite_pieces(fd, p, n, at);
}

enum { COPY_CHUNK = 64 << 20, BUF = PACK_COPY_BUF };

/* Bytes [off, off+len) of source s, at `at` of the pack. */
static int copy_segment(const ckpt_source *s, uint64_t off, uint64_t len, int out, uint64_t at,
                        char *buf) {
    int in = s->zst ? -1 : s->fd >= 0 ? s->fd : ckpt_source_open_again(s);
    uint64_t done = 0;
    while (in >= 0 && done < len) {
        loff_t src_at = (loff_t)(s->base + off + done), dst_at = (loff_t)(at + done);
        size_t want = len - done < COPY_CHUNK ? (size_t)(len - done) : COPY_CHUNK;
        ssize_t r = copy_file_range(in, &src_at, out, &dst_at, want, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break; /* not here: the rest through the buffer */
        done += (uint64_t)r;
    }
    if (in >= 0 && in != s->fd) close(in);
    while (done < len) {
        size_t want = len - done < BUF ? (size_t)(len - done) : BUF;
        ssize_t r = ckpt_source_pread(s, buf, want, off + done);
        if (r <= 0) return r < 0 ? (int)r : -EIO;
        int e = pack_pwrite_all(out, buf, (size_t)r, at + done);
        if (e) return e;
        done += (uint64_t)r;
    }
    return 0;
}

int pack_append_tensor(stage *st, const ckpt_catalog *cat, const ckpt_tensor *t, int out,
                       uint64_t at, char *buf) {
    uint64_t off = 0;
    while (off < t->nbytes) {
        ckpt_segment seg[64];
        uint64_t done;
        size_t n = ckpt_plan(t, off, t->nbytes - off, seg, 64, &done);
        if (n == 0) return -EIO;
        uint64_t pos = at + off;
        for (size_t i = 0; i < n; i++) {
            int e = seg[i].kind == CKPT_SEG_MEM
                        ? pack_pwrite_all(out, seg[i].mem, seg[i].length, pos)
                    : seg[i].kind == CKPT_SEG_FILE
                        ? copy_segment(&cat->sources[seg[i].source], seg[i].offset, seg[i].length,
                                       out, pos, buf)
                        : -EIO;
            if (e) return e;
            pos += seg[i].length;
        }
        off += done;
        atomic_fetch_add(&st->progress_done, done);
    }
    return 0;
}

int pack_header(const ckpt_catalog *cat, const placed *p, size_t n, char **out) {
    *out = NULL;
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < n; i++) {
        const ckpt_tensor *t = &cat->tensors[p[i].tensor];
        sb_putc(&sb, ',');
        sb_json_str(&sb, t->name, t->name_len);
        sb_printf(&sb, ":{\"dtype\":\"%s\",\"shape\":[", ckpt_dtype_info_of(t->dtype)->name);
        for (uint32_t d = 0; d < t->ndim; d++)
            sb_printf(&sb, "%s%llu", d ? "," : "", (unsigned long long)t->shape[d]);
        sb_printf(&sb, "],\"data_offsets\":[%llu,%llu]}",
                  (unsigned long long)(p[i].off - PACK_DATA_START),
                  (unsigned long long)(p[i].off - PACK_DATA_START + t->nbytes));
    }
    sb_putc(&sb, '}');
    const size_t room = PACK_DATA_START - 8;
    if (sb.failed || sb.len > room) {
        bool too_big = !sb.failed;
        sb_free(&sb);
        return too_big ? 1 : -ENOMEM;
    }
    char *head = malloc(PACK_DATA_START);
    if (!head) {
        sb_free(&sb);
        return -ENOMEM;
    }
    uint64_t len = room;
    for (int i = 0; i < 8; i++) head[i] = (char)(len >> (8 * i) & 0xff);
    memcpy(head + 8, sb.data, sb.len);
    memset(head + 8 + sb.len, ' ', room - sb.len);
    sb_free(&sb);
    *out = head;
    return 0;
}

/* The header written in front of the pack. */
static int write_header(const ckpt_catalog *cat, const placed *p, size_t n, int out) {
    char *head;
    int e = pack_header(cat, p, n, &head);
    if (e) return e;
    e = pack_pwrite_all(out, head, PACK_DATA_START, 0);
    free(head);
    return e;
}

int pack_fsync_parent(const char *path) {
    char copy[PATH_MAX];
    snprintf(copy, sizeof copy, "%s", path);
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -errno;
    int rc = fsync(fd) == 0 ? 0 : -errno;
    close(fd);
    return rc;
}

int note_landing(stage *st, int fd, const char *path) {
    if (!stage_replaces_source(st)) return 0;
    struct stat s;
    if (fd >= 0 ? fstat(fd, &s) != 0 : stat(path, &s) != 0) return -errno;
    pthread_mutex_lock(&st->lock);
    int rc = spool_note_landing(st, &s);
    pthread_mutex_unlock(&st->lock);
    return rc;
}

int pack_publish(stage *st, int fd, uint64_t id, ckpt_err *err) {
    char tmp[PATH_MAX], dir[PATH_MAX], base[PATH_MAX], pack[64];
    snprintf(dir, sizeof dir, "%s", st->out);
    snprintf(base, sizeof base, "%s", st->out);
    snprintf(pack, sizeof pack, "/proc/self/fd/%d", fd);
    int rc = note_landing(st, fd, NULL);
    if (rc)
        return ckpt_fail(err, rc, "%s: the spool cannot record the commit: %s", st->out,
                         strerror(-rc));
    for (int attempt = 0;; attempt++) {
        snprintf(tmp, sizeof tmp, "%s/.%s.partial-%llx-%d", dirname(dir), basename(base),
                 (unsigned long long)id, attempt);
        snprintf(dir, sizeof dir, "%s", st->out); /* dirname may have changed it */
        if (linkat(AT_FDCWD, pack, AT_FDCWD, tmp, AT_SYMLINK_FOLLOW) == 0) break;
        if (errno != EEXIST || attempt == 16)
            return ckpt_fail(err, -errno, "%s: cannot link the staged file beside it: %s", st->out,
                             strerror(errno));
    }
    if (rename(tmp, st->out) != 0) {
        int e = errno;
        unlink(tmp);
        return ckpt_fail(err, -e, "%s: rename into place: %s", st->out, strerror(e));
    }
    rc = pack_fsync_parent(st->out);
    if (rc) return ckpt_fail(err, rc, "%s: fsync of its directory failed", st->out);
    return 0;
}

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
    bool go = mode == PACK_FILE && (st->pack_fd >= 0 || open_new_pack(st) == 0);
    uint64_t id = st->pack_id, live = go ? pack_live_end(st->root, id) : 0;
    pthread_mutex_unlock(&st->lock);
    if (!go) return 1;
    struct stat ps;
    if (fstat(st->pack_fd, &ps) != 0) return 1;

    placed *in = malloc((cat->ntensors ? cat->ntensors : 1) * sizeof *in);
    size_t *rest = malloc((cat->ntensors ? cat->ntensors : 1) * sizeof *rest);
    char *buf = malloc(BUF);
    size_t nin = 0, nrest = 0;
    int rc = in && rest && buf ? 0 : ckpt_fail(err, -ENOMEM, "out of memory");
    for (size_t i = 0; !rc && i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        if (t->aside) continue;
        if (!pack_fits_safetensors(t)) {
            rc = 1;
            break;
        }
        const ckpt_piece *p = t->npieces == 1 ? &t->pieces[0] : NULL;
        const ckpt_source *s = p ? &cat->sources[p->source] : NULL;
        if (s && !p->strides && s->dev == ps.st_dev && s->ino == ps.st_ino && !s->member_of &&
            t->nbytes)
            in[nin++] = (placed){i, p->file_offset};
        else
            rest[nrest++] = i;
    }
    /* The tensors in the pack must tile it from the data start: a gap is a hole. */
    uint64_t at = PACK_DATA_START;
    if (!rc && nin) qsort(in, nin, sizeof *in, placed_cmp);
    for (size_t k = 0; !rc && k < nin; k++) {
        if (in[k].off != at) rc = 1;
        at += cat->tensors[in[k].tensor].nbytes;
    }
    if (!rc && live > at) rc = 1; /* a staged file that is no tensor lies beyond */
    if (!rc && nrest) qsort_r(rest, nrest, sizeof *rest, pack_width_cmp, cat);
    placed *all = rc ? NULL : realloc(in, (nin + nrest ? nin + nrest : 1) * sizeof *in);
    if (!rc && !all) rc = ckpt_fail(err, -ENOMEM, "out of memory");
    if (all) in = all;
    for (size_t k = 0; !rc && k < nrest; k++) {
        const ckpt_tensor *t = &cat->tensors[rest[k]];
        int e = pack_append_tensor(st, cat, t, st->pack_fd, at, buf);
        if (e)
            rc = ckpt_fail(err, e, "%s: appending tensor \"%.*s\" to the staged file: %s", st->out,
                           (int)(t->name_len > 120 ? 120 : t->name_len), t->name, strerror(-e));
        in[nin++] = (placed){rest[k], at};
        at += t->nbytes;
    }
    if (!rc) {
        int e = write_header(cat, in, nin, st->pack_fd);
        if (e < 0) rc = ckpt_fail(err, e, "%s: writing the header: %s", st->out, strerror(-e));
        if (e > 0) rc = 1; /* too many names for the reserved room */
    }
    if (!rc && ftruncate(st->pack_fd, (off_t)at) != 0)
        rc = ckpt_fail(err, -errno, "%s: truncating the staged file: %s", st->out, strerror(errno));
    if (!rc) { /* spool files are 0600; OUT gets the usual mode, from the umask */
        fchmod(st->pack_fd, 0666 & ~ckpt_umask());
    }
    if (!rc && fsync(st->pack_fd) != 0)
        rc = ckpt_fail(err, -errno, "%s: fsync: %s", st->out, strerror(errno));
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
    free(in);
    free(rest);
    free(buf);
    return rc;
}
