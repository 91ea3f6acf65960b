/* Source files that a directory OUT takes whole: a commit after `--from` costs what changed.
 *
 * A safetensors file of the --from source (the single file, or a shard of an HF directory,
 * typically OUT's own shard after a commit of `--from OUT/`) none of whose tensors changed,
 * was renamed or removed, and to which nothing was added, is exactly a shard the commit would
 * otherwise copy byte for byte. It is hard-linked into the new OUT as it is instead: its
 * header is its own (whatever wrote it), its bytes are not read or written. The file is never
 * written to, so the old OUT stays intact through every point of the commit, and a link is
 * all a kill -9 can leave behind (in the partial directory the stage's clean-up removes).
 *
 * The check reads the file's own header, not the catalog the stage loaded: an entry the
 * source's reader did not show (a tensor missing from an index's weight_map) would otherwise
 * come along into OUT unseen. Every entry must be a staged tensor of that file at the same
 * offset with the same name, dtype and shape, and the file must end at its data's end. */
#include "stage_pack_whole.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { MAX_HEADER = 100 << 20 }; /* as the safetensors reader allows */

static int off_cmp(const void *a, const void *b) {
    uint64_t x = ((const placed *)a)->off, y = ((const placed *)b)->off;
    return (x > y) - (x < y);
}

static const placed *find_off(const placed *p, size_t n, uint64_t off) {
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

bool pack_entry_is(const json_value *m, const ckpt_tensor *t) {
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

int pack_read_header(int fd, uint64_t size, char **text, json_doc *doc, uint64_t *data) {
    unsigned char le[8];
    *text = NULL;
    memset(doc, 0, sizeof *doc);
    if (size < 8 || pread(fd, le, 8, 0) != 8) return -1;
    uint64_t len = 0;
    for (int i = 7; i >= 0; i--) len = len << 8 | le[i];
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

bool pack_entry_span(const json_value *m, uint64_t room, uint64_t *a, uint64_t *b) {
    const json_value *offs = m->type == JSON_OBJECT ? json_member(m, "data_offsets") : NULL;
    return offs && offs->type == JSON_ARRAY && offs->count == 2 && json_as_u64(offs->head, a) &&
           json_as_u64(offs->head->next, b) && *a <= *b && *b <= room;
}

bool pack_is_metadata(const json_value *m) {
    return m->key_len == 12 && memcmp(m->key, "__metadata__", 12) == 0;
}

/* Whether the file behind fd (size bytes) holds exactly the tensors p[0..n) (sorted by
 * offset) with their names, dtypes and shapes, and nothing else. */
static bool holds_exactly(const ckpt_catalog *cat, int fd, uint64_t size, const placed *p,
                          size_t n) {
    char *text;
    json_doc doc;
    uint64_t data;
    if (pack_read_header(fd, size, &text, &doc, &data) != 0) return false;
    bool ok = true;
    size_t entries = 0;
    uint64_t end = data;
    for (const json_value *m = doc.root->head; ok && m; m = m->next) {
        if (pack_is_metadata(m)) continue;
        uint64_t a, b;
        ok = pack_entry_span(m, size - data, &a, &b);
        const placed *hit = ok ? find_off(p, n, data + a) : NULL;
        ok = hit && cat->tensors[hit->tensor].nbytes == b - a &&
             pack_entry_is(m, &cat->tensors[hit->tensor]);
        if (ok && data + b > end) end = data + b;
        entries++;
    }
    ok = ok && entries == n && end == size;
    json_doc_free(&doc);
    free(text);
    return ok;
}

int pack_take_whole(const ckpt_catalog *cat, dev_t dev, uint64_t max, size_t *rest, size_t *nrest,
                    snode **moving, whole_file **out, size_t *nout) {
    *out = NULL;
    *nout = 0;
    whole_file *w = NULL;
    size_t nw = 0;
    placed *p = malloc((*nrest ? *nrest : 1) * sizeof *p);
    bool *taken = calloc(*nrest ? *nrest : 1, sizeof *taken);
    if (!p || !taken) {
        free(p);
        free(taken);
        return -ENOMEM;
    }
    int rc = 0;
    for (uint32_t u = 0; !rc && u < cat->nsources; u++) {
        const ckpt_source *s = &cat->sources[u];
        if (!ckpt_source_whole_file(s) || s->owned || s->dev != dev) continue;
        size_t n = 0;
        uint64_t bytes = 0;
        bool whole = true;
        for (size_t k = 0; k < *nrest; k++) {
            const ckpt_tensor *t = &cat->tensors[rest[k]];
            if (t->npieces != 1 || t->pieces[0].source != u) continue;
            /* a file moved out of a cut pack, a view of strided bytes: not a file's own */
            if (moving[k] || t->pieces[0].strides || !t->nbytes) whole = false;
            p[n++] = (placed){rest[k], t->pieces[0].file_offset};
            bytes += t->nbytes;
        }
        /* more than one tensor over the shard limit: the writer's cut applies */
        if (!n || !whole || (n > 1 && bytes > max)) continue;
        qsort(p, n, sizeof *p, off_cmp);
        int fd = ckpt_source_open_again(s);
        if (fd < 0) continue;
        struct stat fs;
        if (fstat(fd, &fs) != 0 || !S_ISREG(fs.st_mode) ||
            !holds_exactly(cat, fd, (uint64_t)fs.st_size, p, n)) {
            close(fd);
            continue;
        }
        whole_file *grown = realloc(w, (nw + 1) * sizeof *w);
        placed *mine = malloc(n * sizeof *mine);
        if (!grown || !mine) {
            if (grown) w = grown;
            free(mine);
            close(fd);
            rc = -ENOMEM;
            break;
        }
        w = grown;
        memcpy(mine, p, n * sizeof *mine);
        w[nw++] = (whole_file){.fd = fd, .dev = fs.st_dev, .ino = fs.st_ino, .t = mine, .n = n};
        for (size_t k = 0; k < *nrest; k++) {
            const ckpt_tensor *t = &cat->tensors[rest[k]];
            if (t->npieces == 1 && t->pieces[0].source == u) taken[k] = true;
        }
    }
    if (rc) {
        for (size_t i = 0; i < nw; i++) {
            close(w[i].fd);
            free(w[i].t);
        }
        free(w);
        w = NULL;
        nw = 0;
    }
    size_t keep = 0;
    for (size_t k = 0; !rc && k < *nrest; k++)
        if (!taken[k]) {
            rest[keep] = rest[k];
            moving[keep++] = moving[k];
        }
    if (!rc) *nrest = keep;
    free(p);
    free(taken);
    *out = w;
    *nout = nw;
    return rc;
}
