#include "segread.h"

#include "strided.h"
#include "../io/zstd_seekable.h"

_Static_assert((size_t)SEGREAD_SCRATCH >= (size_t)STRIDED_SCRATCH,
               "strided reads use the gather scratch");

#include <errno.h>
#include <stdbool.h>
#include <string.h>

enum {
    WINDOW = 256,   /* segments considered together */
    LOOKAHEAD = 32, /* stop looking for more fragments of a source after this many others */
};

static int read_full(const ckpt_source *s, char *dst, uint64_t off, uint64_t len) {
    uint64_t got = 0;
    while (got < len) {
        ssize_t r = ckpt_source_pread(s, dst + got, (size_t)(len - got), off + got);
        if (r < 0) return (int)r;
        if (r == 0) return -EIO; /* EOF inside a segment: the source shrank */
        got += (uint64_t)r;
    }
    return 0;
}

/* Segments of seg[first]'s source after it, ascending in the file, that with it fill at least
 * half of one scratch window: their indexes go to members[], the count is returned. */
static size_t gather_group(const ckpt_segment *seg, size_t m, size_t first, const bool *done,
                           size_t *members, uint64_t *lo_out, uint64_t *hi_out) {
    const ckpt_segment *s = &seg[first];
    uint64_t lo = s->offset, hi = lo + s->length, bytes = s->length;
    size_t count = 0, last = first;
    members[count++] = first;
    for (size_t j = first + 1; j < m && j - last <= LOOKAHEAD; j++) {
        const ckpt_segment *t = &seg[j];
        if (done[j] || t->kind != CKPT_SEG_FILE || t->source != s->source) continue;
        if (t->offset < hi) break;
        uint64_t end = t->offset + t->length;
        if (end - lo > SEGREAD_SCRATCH || (bytes + t->length) * 2 < end - lo) break;
        members[count++] = j;
        hi = end;
        bytes += t->length;
        last = j;
    }
    *lo_out = lo;
    *hi_out = hi;
    return count;
}

/* The sources one call read from, checked once each at its end (see ckpt_source_unchanged):
 * a source rewritten in place while we read must give EIO, not a mix of old and new bytes. */
typedef struct read_sources {
    uint32_t ids[LOOKAHEAD];
    size_t n;
} read_sources;

static bool all_unchanged(const ckpt_catalog *cat, read_sources *rs) {
    bool ok = true;
    for (size_t i = 0; i < rs->n; i++) ok &= ckpt_source_unchanged(&cat->sources[rs->ids[i]]);
    rs->n = 0;
    return ok;
}

/* Notes a source read; when the list is full, the ones noted so far are checked now. */
static bool note_source(const ckpt_catalog *cat, read_sources *rs, uint32_t id) {
    for (size_t i = 0; i < rs->n; i++)
        if (rs->ids[i] == id) return true;
    bool ok = rs->n < LOOKAHEAD || all_unchanged(cat, rs);
    rs->ids[rs->n++] = id;
    return ok;
}

int ckpt_read_segments(const ckpt_catalog *cat, const ckpt_segment *seg, size_t n, char *dst,
                       char *scratch) {
    read_sources rs = {.n = 0};
    for (size_t base = 0; base < n; base += WINDOW) {
        const ckpt_segment *w = seg + base;
        size_t m = n - base < WINDOW ? n - base : WINDOW;
        uint64_t pos[WINDOW];
        bool done[WINDOW];
        size_t members[WINDOW];
        uint64_t at = 0;
        for (size_t k = 0; k < m; k++) {
            pos[k] = at;
            at += w[k].length;
            done[k] = false;
        }
        for (size_t k = 0; k < m; k++) {
            if (done[k]) continue;
            const ckpt_segment *s = &w[k];
            if (s->kind == CKPT_SEG_MEM) {
                memcpy(dst + pos[k], s->mem, s->length);
                continue;
            }
            if (s->kind == CKPT_SEG_STRIDED) {
                int e = strided_read(cat, s, dst + pos[k], scratch);
                if (e) return e;
                continue;
            }
            if (s->kind != CKPT_SEG_FILE) return -EIO;
            const ckpt_source *src = &cat->sources[s->source];
            if (!note_source(cat, &rs, s->source)) return -EIO;
            uint64_t lo, hi;
            size_t count = scratch && s->length < SEGREAD_SCRATCH
                               ? gather_group(w, m, k, done, members, &lo, &hi)
                               : 1;
            int e;
            if (count < 2) {
                e = read_full(src, dst + pos[k], s->offset, s->length);
                if (e) return e;
                continue;
            }
            if ((e = read_full(src, scratch, lo, hi - lo))) return e;
            for (size_t i = 0; i < count; i++) {
                const ckpt_segment *t = &w[members[i]];
                memcpy(dst + pos[members[i]], scratch + (t->offset - lo), t->length);
                done[members[i]] = true;
            }
        }
        dst += at;
    }
    return all_unchanged(cat, &rs) ? 0 : -EIO;
}

void ckpt_read_workers_allow(void) {
    zst_read_ahead_allow();
    strided_workers_allow();
}
