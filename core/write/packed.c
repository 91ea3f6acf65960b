/* Safetensors files a caller laid out (packed.h): their headers, what an existing file's own
 * header says about its layout, and a directory OUT assembled from them. */
#include "packed.h"

#include "../model/st_names.h"
#include "../util/hashmap.h"
#include "../util/json.h"
#include "../util/le.h"
#include "../util/pwrite_pieces.h"
#include "../util/utf8.h"
#include "../views/st_layout.h"
#include "writer.h"
#include "writers/writers.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { MAX_HEADER = 100 << 20 }; /* as the safetensors reader allows */

bool ckpt_packed_fits(const ckpt_tensor *t) {
    return ckpt_dtype_info_of(t->dtype)->safetensors && !t->incomplete &&
           utf8_invalid_at(t->name, t->name_len) == t->name_len &&
           !ckpt_safetensors_reserved_name(t->name, t->name_len);
}

int ckpt_packed_header(const ckpt_catalog *cat, const ckpt_placed *p, size_t n, uint64_t data_start,
                       char **head) {
    *head = NULL;
    if (data_start < 8) return 1;
    st_placed *at = malloc((n ? n : 1) * sizeof *at);
    if (!at) return -ENOMEM;
    for (size_t i = 0; i < n; i++) at[i] = (st_placed){p[i].tensor, p[i].off - data_start};
    size_t len;
    int rc = st_header(cat, at, n, data_start - 8, head, &len);
    free(at);
    return rc;
}

int ckpt_packed_write_header(int fd, const ckpt_catalog *cat, const ckpt_placed *p, size_t n,
                             uint64_t data_start) {
    char *head;
    int rc = ckpt_packed_header(cat, p, n, data_start, &head);
    if (rc) return rc;
    rc = pwrite_pieces(fd, head, (size_t)data_start, 0);
    free(head);
    return rc;
}

bool ckpt_packed_header_is(int fd, const ckpt_catalog *cat, const ckpt_placed *p, size_t n,
                           uint64_t data_start) {
    char *want, *have = malloc(data_start ? (size_t)data_start : 1);
    if (!have || ckpt_packed_header(cat, p, n, data_start, &want) != 0) {
        free(have);
        return false;
    }
    bool same = pread(fd, have, (size_t)data_start, 0) == (ssize_t)data_start &&
                memcmp(have, want, (size_t)data_start) == 0;
    free(have);
    free(want);
    return same;
}

enum { COPY_CHUNK = 64 << 20 };

/* Bytes [off, off+len) of source s, at `at` of fd. */
static int copy_segment(const ckpt_source *s, uint64_t off, uint64_t len, int out, uint64_t at,
                        char *buf) {
    uint64_t file_off = 0;
    int in = !ckpt_source_file_extent(s, off, len, &file_off) ? -1
             : s->fd >= 0                                     ? s->fd
                                                              : ckpt_source_open_again(s);
    uint64_t done = 0;
    while (in >= 0 && done < len) {
        loff_t src_at = (loff_t)(file_off + done), dst_at = (loff_t)(at + done);
        size_t want = len - done < COPY_CHUNK ? (size_t)(len - done) : COPY_CHUNK;
        ssize_t r = copy_file_range(in, &src_at, out, &dst_at, want, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break; /* not here: the rest through the buffer */
        done += (uint64_t)r;
    }
    if (in >= 0 && in != s->fd) close(in);
    while (done < len) {
        size_t want = len - done < CKPT_PACKED_BUF ? (size_t)(len - done) : CKPT_PACKED_BUF;
        ssize_t r = ckpt_source_pread(s, buf, want, off + done);
        if (r <= 0) return r < 0 ? (int)r : -EIO;
        int e = pwrite_pieces(out, buf, (size_t)r, at + done);
        if (e) return e;
        done += (uint64_t)r;
    }
    /* After the copy, as every reader does: what was copied is the source's own bytes only if
     * the file is still the one the catalog saw (a write moves mtime and ctime first). */
    return ckpt_source_unchanged(s) ? 0 : -EIO;
}

int ckpt_packed_append(const ckpt_catalog *cat, const ckpt_tensor *t, int fd, uint64_t at,
                       char *buf, _Atomic uint64_t *done) {
    uint64_t off = 0;
    while (off < t->nbytes) {
        ckpt_segment seg[64];
        uint64_t got;
        size_t n = ckpt_plan(t, off, t->nbytes - off, seg, 64, &got);
        if (n == 0) return -EIO;
        uint64_t pos = at + off;
        for (size_t i = 0; i < n; i++) {
            int e = seg[i].kind == CKPT_SEG_MEM ? pwrite_pieces(fd, seg[i].mem, seg[i].length, pos)
                    : seg[i].kind == CKPT_SEG_FILE
                        ? copy_segment(&cat->sources[seg[i].source], seg[i].offset, seg[i].length,
                                       fd, pos, buf)
                        : -EIO;
            if (e) return e;
            pos += seg[i].length;
        }
        off += got;
        atomic_fetch_add(done, got);
    }
    return 0;
}

static int wider_first(const void *a, const void *b, void *ctx) {
    const ckpt_catalog *cat = ctx;
    const ckpt_tensor *x = &cat->tensors[*(const size_t *)a],
                      *y = &cat->tensors[*(const size_t *)b];
    unsigned wx = ckpt_dtype_elem_size(x->dtype), wy = ckpt_dtype_elem_size(y->dtype);
    return (wx < wy) - (wx > wy);
}

void ckpt_packed_sort_widest(const ckpt_catalog *cat, size_t *tensors, size_t n) {
    if (n) qsort_r(tensors, n, sizeof *tensors, wider_first, (void *)cat);
}

static int by_off(const void *a, const void *b) {
    uint64_t x = ((const ckpt_placed *)a)->off, y = ((const ckpt_placed *)b)->off;
    return (x > y) - (x < y);
}

/* The model's tensors that lie in the file (dev, ino) as they are, by offset, into in[], and
 * the others into rest[]: 0, or 1 when one of them safetensors cannot hold. */
static int split_in_file(const ckpt_catalog *cat, dev_t dev, ino_t ino, ckpt_placed *in,
                         size_t *nin, size_t *rest, size_t *nrest) {
    *nin = *nrest = 0;
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        if (t->aside) continue;
        if (!ckpt_packed_fits(t)) return 1;
        const ckpt_piece *p = t->npieces == 1 ? &t->pieces[0] : NULL;
        const ckpt_source *s = p ? &cat->sources[p->source] : NULL;
        if (s && !p->strides && ckpt_source_is_file(s, dev, ino) && t->nbytes)
            in[(*nin)++] = (ckpt_placed){i, p->file_offset};
        else
            rest[(*nrest)++] = i;
    }
    if (*nin) qsort(in, *nin, sizeof *in, by_off);
    return 0;
}

int ckpt_packed_finish_file(const ckpt_catalog *cat, int fd, uint64_t data_start, uint64_t live_end,
                            char *buf, _Atomic uint64_t *done, const char *out, ckpt_err *err) {
    struct stat ps;
    if (fstat(fd, &ps) != 0) return 1;
    size_t cap = cat->ntensors ? cat->ntensors : 1, nin = 0, nrest = 0;
    ckpt_placed *in = malloc(cap * sizeof *in);
    size_t *rest = malloc(cap * sizeof *rest);
    int rc = in && rest ? split_in_file(cat, ps.st_dev, ps.st_ino, in, &nin, rest, &nrest)
                        : ckpt_fail(err, -ENOMEM, "out of memory");
    /* The tensors in the file must tile it from the data start: a gap is a hole. */
    uint64_t at = data_start;
    for (size_t k = 0; !rc && k < nin; k++) {
        if (in[k].off != at) rc = 1;
        at += cat->tensors[in[k].tensor].nbytes;
    }
    if (!rc && live_end > at) rc = 1; /* a file of the caller that is no tensor lies beyond */
    if (!rc) ckpt_packed_sort_widest(cat, rest, nrest);
    for (size_t k = 0; !rc && k < nrest; k++) {
        const ckpt_tensor *t = &cat->tensors[rest[k]];
        int e = ckpt_packed_append(cat, t, fd, at, buf, done);
        if (e)
            rc = ckpt_fail(err, e, "%s: appending tensor \"%.*s\" to the staged file: %s", out,
                           (int)(t->name_len > 120 ? 120 : t->name_len), t->name, strerror(-e));
        in[nin++] = (ckpt_placed){rest[k], at};
        at += t->nbytes;
    }
    if (!rc) {
        int e = ckpt_packed_write_header(fd, cat, in, nin, data_start);
        if (e < 0) rc = ckpt_fail(err, e, "%s: writing the header: %s", out, strerror(-e));
        if (e > 0) rc = 1; /* too many names for the reserved room */
    }
    if (!rc && ftruncate(fd, (off_t)at) != 0)
        rc = ckpt_fail(err, -errno, "%s: truncating the staged file: %s", out, strerror(errno));
    if (!rc) fchmod(fd, 0666 & ~ckpt_umask()); /* a private temporary until now */
    if (!rc && fsync(fd) != 0) rc = ckpt_fail(err, -errno, "%s: fsync: %s", out, strerror(errno));
    free(in);
    free(rest);
    return rc;
}

/* A safetensors file's header (the file behind fd, size bytes): 0 with *text (malloc'd, the
 * document points into it), *doc and *data (where the data starts), or -1. */
static int read_header(int fd, uint64_t size, char **text, json_doc *doc, uint64_t *data) {
    unsigned char le[8];
    *text = NULL;
    memset(doc, 0, sizeof *doc);
    if (size < 8 || pread(fd, le, 8, 0) != 8) return -1;
    uint64_t len = le64(le);
    if (len < 2 || len > MAX_HEADER || len > size - 8) return -1;
    if (!(*text = malloc(len))) return -1;
    json_error jerr;
    if (pread(fd, *text, len, 8) != (ssize_t)len || json_parse(doc, *text, len, &jerr) != 0 ||
        doc->root->type != JSON_OBJECT) {
        json_doc_free(doc);
        free(*text);
        *text = NULL;
        return -1;
    }
    *data = 8 + len;
    return 0;
}

/* A header entry's data_offsets [*a, *b), within room bytes of data. */
static bool entry_span(const json_value *m, uint64_t room, uint64_t *a, uint64_t *b) {
    const json_value *offs = m->type == JSON_OBJECT ? json_member(m, "data_offsets") : NULL;
    return offs && offs->type == JSON_ARRAY && offs->count == 2 && json_as_u64(offs->head, a) &&
           json_as_u64(offs->head->next, b) && *a <= *b && *b <= room;
}

static bool is_metadata(const json_value *m) {
    return ckpt_safetensors_reserved_name(m->key, m->key_len);
}

/* Whether header entry m names tensor t with its dtype and shape. */
static bool entry_is(const json_value *m, const ckpt_tensor *t) {
    if (m->key_len != t->name_len || memcmp(m->key, t->name, t->name_len) != 0) return false;
    const json_value *dt = json_member(m, "dtype"), *shape = json_member(m, "shape");
    if (!dt || !json_str_eq(dt, ckpt_dtype_info_of(t->dtype)->name)) return false;
    if (!shape || shape->type != JSON_ARRAY || shape->count != t->ndim) return false;
    uint32_t d = 0;
    for (const json_value *v = shape->head; v; v = v->next, d++) {
        uint64_t x;
        if (!json_as_u64(v, &x) || x != t->shape[d]) return false;
    }
    return true;
}

static const ckpt_placed *find_off(const ckpt_placed *p, size_t n, uint64_t off) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (p[mid].off < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && p[lo].off == off ? &p[lo] : NULL;
}

bool ckpt_packed_holds_exactly(const ckpt_catalog *cat, int fd, uint64_t size, const ckpt_placed *p,
                               size_t n) {
    char *text;
    json_doc doc;
    uint64_t data;
    if (read_header(fd, size, &text, &doc, &data) != 0) return false;
    bool ok = true;
    size_t entries = 0;
    uint64_t end = data;
    for (const json_value *m = doc.root->head; ok && m; m = m->next) {
        if (is_metadata(m)) continue;
        uint64_t a, b;
        ok = entry_span(m, size - data, &a, &b);
        const ckpt_placed *hit = ok ? find_off(p, n, data + a) : NULL;
        ok = hit && cat->tensors[hit->tensor].nbytes == b - a &&
             entry_is(m, &cat->tensors[hit->tensor]);
        if (ok && data + b > end) end = data + b;
        entries++;
    }
    ok = ok && entries == n && end == size;
    json_doc_free(&doc);
    free(text);
    return ok;
}

/* The model's tensors by name, each once and each one safetensors can hold: false if not. */
static bool names_of(const ckpt_catalog *cat, hashmap *names, size_t *count) {
    *count = 0;
    if (!hm_init(names, cat->ntensors)) return false;
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        if (t->aside) continue;
        bool added;
        if (!ckpt_packed_fits(t) || !hm_put(names, t->name, t->name_len, i, &added) || !added)
            return false;
        (*count)++;
    }
    return true;
}

int ckpt_packed_layout(const ckpt_catalog *cat, int fd, uint64_t size, ckpt_placed **out,
                       size_t *n) {
    *out = NULL;
    *n = 0;
    char *text;
    json_doc doc;
    uint64_t data;
    if (read_header(fd, size, &text, &doc, &data) != 0) return 1;
    hashmap names = {0};
    size_t staged;
    bool ok = names_of(cat, &names, &staged);
    bool *seen = ok ? calloc(cat->ntensors ? cat->ntensors : 1, sizeof *seen) : NULL;
    ckpt_placed *w = ok ? malloc((staged ? staged : 1) * sizeof *w) : NULL;
    int rc = ok && !(seen && w) ? -ENOMEM : 0;
    ok = ok && seen && w;
    size_t entries = 0;
    uint64_t end = data;
    for (const json_value *m = ok ? doc.root->head : NULL; ok && m; m = m->next) {
        if (is_metadata(m)) continue;
        uint64_t a, b;
        const hm_entry *e = NULL;
        ok = entry_span(m, size - data, &a, &b) &&
             (e = hm_get(&names, m->key, m->key_len)) != NULL && !seen[e->value];
        const ckpt_tensor *t = ok ? &cat->tensors[e->value] : NULL;
        ok = ok && t->nbytes == b - a && entry_is(m, t);
        if (!ok) break;
        seen[e->value] = true;
        w[entries++] = (ckpt_placed){e->value, data + a};
        if (data + b > end) end = data + b;
    }
    ok = ok && entries == staged && end == size;
    hm_free(&names);
    free(seen);
    json_doc_free(&doc);
    free(text);
    if (!ok) {
        free(w);
        return rc ? rc : 1;
    }
    *out = w;
    *n = entries;
    return 0;
}

/* A small file of the new directory, written and fsynced. */
static int write_small(int dfd, const char *name, const char *text, size_t len, mode_t mode) {
    int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) return -errno;
    int rc = pwrite_pieces(fd, text, len, 0);
    if (!rc && fsync(fd) != 0) rc = -errno;
    close(fd);
    return rc;
}

static int by_name(const void *a, const void *b, void *cat) {
    return st_name_cmp(cat, ((const st_placed *)a)->tensor, ((const st_placed *)b)->tensor);
}

/* The index of the shards: names in byte order, each with its shard. */
static char *index_json(const ckpt_catalog *cat, const ckpt_packed_shard *s, size_t n,
                        size_t *len) {
    size_t count = 0;
    uint64_t total = 0;
    for (size_t k = 0; k < n; k++) count += s[k].n;
    st_placed *all = malloc((count ? count : 1) * sizeof *all);
    if (!all) return NULL;
    size_t at = 0;
    for (size_t k = 0; k < n; k++)
        for (size_t i = 0; i < s[k].n; i++) {
            all[at++] = (st_placed){s[k].t[i].tensor, k};
            total += cat->tensors[s[k].t[i].tensor].nbytes;
        }
    qsort_r(all, count, sizeof *all, by_name, (void *)cat);
    strbuf sb;
    sb_init(&sb);
    st_index_json(&sb, cat, all, count, n, total);
    free(all);
    return sb_take(&sb, len);
}

/* The new directory tmp: a link to each shard, the index, config and tokenizer files. */
static int assemble(const ckpt_catalog *cat, const char *tmp, const ckpt_packed_shard *s, size_t n,
                    ckpt_err *err) {
    int dfd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return ckpt_fail(err, -errno, "%s: %s", tmp, strerror(errno));
    mode_t mode = (0666 & ~ckpt_umask()) & (0600 | (out_data_sources_mode(cat) & 0066));
    int rc = 0;
    for (size_t k = 0; !rc && k < n; k++) {
        char name[ST_SHARD_NAME_MAX], proc[64];
        st_shard_name(name, k, n);
        snprintf(proc, sizeof proc, "/proc/self/fd/%d", s[k].fd);
        if (!s[k].keep_mode) fchmod(s[k].fd, mode);
        if (linkat(AT_FDCWD, proc, dfd, name, AT_SYMLINK_FOLLOW) != 0)
            rc = ckpt_fail(err, -errno, "%s/%s: cannot link the shard: %s", tmp, name,
                           strerror(errno));
    }
    if (!rc && n > 1) {
        size_t len;
        char *text = index_json(cat, s, n, &len);
        rc = text ? write_small(dfd, ST_INDEX_NAME, text, len, mode) : -ENOMEM;
        if (rc) ckpt_fail(err, rc, "%s: writing the index: %s", tmp, strerror(-rc));
        free(text);
    }
    if (!rc) rc = writer_dir_aux(cat, tmp, err);
    if (!rc && fsync(dfd) != 0) rc = ckpt_fail(err, -errno, "%s: fsync: %s", tmp, strerror(errno));
    close(dfd);
    return rc;
}

/* Everything in the unfinished directory tmp, then tmp. */
static void remove_tmp(const char *tmp) {
    int dfd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!d && dfd >= 0) close(dfd);
    for (struct dirent *e; d && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlinkat(dirfd(d), e->d_name, 0);
    if (d) closedir(d);
    rmdir(tmp);
}

int ckpt_write_packed_dir(const ckpt_catalog *cat, const char *out, const ckpt_packed_shard *s,
                          size_t n, const ckpt_write_opts *opts, ckpt_err *err) {
    char path[PATH_MAX], tmp[PATH_MAX];
    size_t len = strlen(out);
    while (len > 1 && out[len - 1] == '/') len--;
    if (len >= sizeof path) return ckpt_fail(err, -ENAMETOOLONG, "%s: path too long", out);
    memcpy(path, out, len);
    path[len] = '\0';
    int rc = writer_dir_temp(path, tmp, sizeof tmp, err);
    if (rc) return rc;
    rc = assemble(cat, tmp, s, n, err);
    if (!rc) rc = writer_publish_dir(tmp, path, opts, err);
    if (rc) remove_tmp(tmp);
    return rc;
}
