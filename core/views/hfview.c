/* The Hugging Face layout view: every tensor of the catalog re-served as safetensors —
 * model.safetensors, or model-0000i-of-0000N.safetensors plus model.safetensors.index.json when
 * the total passes max_shard_size. Headers are synthesized; tensor bytes are virtual-file parts
 * assembled on read, never copied.
 *
 * The headers follow the reference writer: compact JSON, {"format":"pt"} metadata first, then
 * tensors ordered by dtype (wider first) and name, padded with spaces to a multiple of 8, so the
 * data section and every tensor in it are naturally aligned and the offsets tile it exactly.
 * A catalog may name other tensors for the view (ckpt_tensor.hf_view) and a config.json to go
 * with them (ckpt_catalog.hf_config): a Meta checkpoint shown as the Llama checkpoint the HF
 * conversion script would write. */
#include "hfview.h"
#include "st_layout.h"
#include "../util/le.h"
#include "../util/search.h"

#include "../model/catalog.h"
#include "hf_tied.h"
#include "../util/strbuf.h"
#include "../util/utf8.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(ST_SHARD_NAME_MAX <= sizeof((ckpt_hfview_file *)0)->name, "shard names fit");

/* The reference writer's dtype order, widest first (safetensors >= 0.6). */
static int dtype_rank(ckpt_dtype dt) {
    static const ckpt_dtype order[] = {
        CKPT_U64,         CKPT_I64,     CKPT_F64,     CKPT_C64,     CKPT_F32, CKPT_U32,
        CKPT_I32,         CKPT_BF16,    CKPT_F16,     CKPT_U16,     CKPT_I16, CKPT_F8_E5M2FNUZ,
        CKPT_F8_E4M3FNUZ, CKPT_F8_E8M0, CKPT_F8_E4M3, CKPT_F8_E5M2, CKPT_I8,  CKPT_U8,
        CKPT_F6_E3M2,     CKPT_F6_E2M3, CKPT_F4,      CKPT_BOOL,
    };
    for (size_t i = 0; i < sizeof order / sizeof *order; i++)
        if (order[i] == dt) return (int)i;
    return (int)(sizeof order / sizeof *order);
}

static int name_order(const void *a, const void *b, void *cat) {
    return st_name_cmp(cat, *(const size_t *)a, *(const size_t *)b);
}

/* Writer order: dtype rank, then name. A stable counting sort by rank keeps the catalog's name
 * order, so a group only needs sorting when prefixes (which the catalog sorts by first) put
 * names out of order: O(n) for the usual catalog instead of a comparison sort of every name. */
static int sort_view_order(const ckpt_catalog *cat, size_t *order, size_t n) {
    enum { RANKS = CKPT_DTYPE_COUNT + 1 };
    int rank_of[CKPT_DTYPE_COUNT];
    for (int d = 0; d < CKPT_DTYPE_COUNT; d++) rank_of[d] = dtype_rank((ckpt_dtype)d);
    size_t start[RANKS + 1] = {0};
    for (size_t i = 0; i < n; i++) start[rank_of[cat->tensors[order[i]].dtype] + 1]++;
    for (int r = 0; r < RANKS; r++) start[r + 1] += start[r];
    size_t *sorted = malloc((n ? n : 1) * sizeof *sorted), fill[RANKS];
    if (!sorted) return -ENOMEM;
    memcpy(fill, start, sizeof fill);
    for (size_t i = 0; i < n; i++) sorted[fill[rank_of[cat->tensors[order[i]].dtype]]++] = order[i];
    memcpy(order, sorted, n * sizeof *order);
    free(sorted);
    for (int r = 0; r < RANKS; r++) {
        size_t *group = order + start[r], len = start[r + 1] - start[r];
        for (size_t i = 1; i < len; i++)
            if (name_order(&group[i - 1], &group[i], (void *)cat) > 0) {
                qsort_r(group, len, sizeof *group, name_order, (void *)cat);
                break;
            }
    }
    return 0;
}

static int add_file(ckpt_hfview *v, const char *name, ckpt_err *err) {
    ckpt_hfview_file *f = realloc(v->files, (v->nfiles + 1) * sizeof *f);
    if (!f) return ckpt_fail(err, -ENOMEM, "out of memory");
    v->files = f;
    memset(&f[v->nfiles], 0, sizeof *f);
    snprintf(f[v->nfiles].name, sizeof f[v->nfiles].name, "%s", name);
    v->nfiles++;
    return 0;
}

static void span_init(ckpt_hfview_span *sp, uint32_t source, uint64_t off, uint64_t len) {
    memset(sp, 0, sizeof *sp);
    sp->len = len;
    sp->piece =
        (ckpt_piece){.source = source, .file_offset = off, .offsets = &sp->zero, .sizes = &sp->len};
    sp->t = (ckpt_tensor){.name = "",
                          .dtype = CKPT_U8,
                          .ndim = 1,
                          .shape = &sp->len,
                          .numel = len,
                          .nbytes = len,
                          .pieces = &sp->piece,
                          .npieces = 1,
                          .aside = true};
}

/* True when tensors order[first..last) lie in one local source, each whole and contiguous, in
 * view order with nothing between them: the shard's data section is then bytes [*base, *base +
 * total) of *source. */
static bool data_is_one_run(const ckpt_catalog *cat, const size_t *order, size_t first, size_t last,
                            uint32_t *source, uint64_t *base) {
    uint64_t at = 0;
    bool have = false;
    for (size_t i = first; i < last; i++) {
        const ckpt_tensor *t = &cat->tensors[order[i]];
        if (!t->nbytes) continue;
        if (t->npieces != 1 || t->index) return false;
        const ckpt_piece *p = &t->pieces[0];
        if (p->strides) return false;
        for (uint32_t d = 0; d < t->ndim; d++)
            if (p->offsets[d] || p->sizes[d] != t->shape[d]) return false;
        if (!have) {
            const ckpt_source *s = &cat->sources[p->source];
            if (s->remote || s->zst || p->file_offset < at) return false;
            *source = p->source;
            *base = p->file_offset - at;
            have = true;
        }
        if (p->source != *source || p->file_offset != *base + at) return false;
        at += t->nbytes;
    }
    return have;
}

/* Compares the rendered entries of a header with a source's bytes from `pos` on, a window at a
 * time. */
typedef struct source_match {
    const ckpt_catalog *cat;
    uint32_t source;
    uint64_t pos, end; /* next byte to compare, end of the source's header */
    char *window;
    size_t wlen, wat;
    bool ok;
} source_match;

enum { MATCH_WINDOW = 1 << 20 };

static void match_bytes(source_match *m, const char *p, size_t n) {
    while (m->ok && n) {
        if (m->wat == m->wlen) {
            uint64_t left = m->end - m->pos;
            m->wlen = left < MATCH_WINDOW ? (size_t)left : MATCH_WINDOW;
            m->wat = 0;
            ckpt_err ignored;
            if (!m->wlen || ckpt_source_read(m->cat, m->source, m->pos, m->window, m->wlen,
                                             "header", &ignored)) {
                m->ok = false;
                return;
            }
            m->pos += m->wlen;
        }
        size_t k = m->wlen - m->wat < n ? m->wlen - m->wat : n;
        if (memcmp(m->window + m->wat, p, k)) m->ok = false;
        m->wat += k;
        p += k;
        n -= k;
    }
}

/* Where the entries of a safetensors source's header start (after "{", or after a metadata
 * member written as the view writes it), and where the header ends; false if it has none. */
static bool source_entries(const ckpt_catalog *cat, uint32_t source, uint64_t data_base,
                           uint64_t *start, uint64_t *end) {
    unsigned char head[8 + ST_HEADER_START_LEN + 1];
    ckpt_err ignored;
    if (ckpt_source_read(cat, source, 0, head, sizeof head, "header", &ignored)) return false;
    uint64_t n = le64(head);
    if (n > data_base || data_base - n != 8 || head[8] != '{') return false;
    *end = 8 + n;
    size_t meta = ST_HEADER_START_LEN;
    *start =
        memcmp(head + 8, st_header_start, meta) == 0 && head[8 + meta] == ',' ? 8 + meta + 1 : 9;
    return true;
}

/* Entries and data of a shard worked out when read: the view order of its tensors, and per page
 * of HFVIEW_PAGE tensors where its first entry starts in the header's entries and its first
 * tensor in the data section. 4 bytes a tensor and 16 a page, instead of the header's text and
 * a part a tensor. */
enum { HFVIEW_PAGE = 256, RENDER_MAX = 64 << 10 };

struct hfview_pages {
    ckpt_vgen entries; /* the entries, each with its leading comma */
    ckpt_vgen data;    /* the data section */
    const ckpt_catalog *cat;
    const uint32_t *order; /* the shard's tensors, in view order */
    size_t n;
    uint64_t *entry_at; /* per page: offset of its first entry in the entries */
    uint64_t *data_at;  /* per page: offset of its first tensor in the data section */
};

/* The last page whose start (at[page]) is at or before off. */
static size_t page_of(const uint64_t *at, size_t npages, uint64_t off) {
    return last_at_or_before(at, npages, off);
}

static size_t npages_of(const hfview_pages *pg) {
    return (pg->n + HFVIEW_PAGE - 1) / HFVIEW_PAGE;
}

/* Renders the entries from the page holding off on, keeping what falls in [off, off+len), into a
 * buffer of the calling thread (at most RENDER_MAX bytes a call: the reader asks again). */
static size_t plan_entries(const ckpt_vgen *g, uint64_t off, uint64_t len, ckpt_segment *seg,
                           size_t cap, uint64_t *done) {
    static _Thread_local char out[RENDER_MAX];
    const hfview_pages *pg =
        (const hfview_pages *)(const void *)((const char *)g - offsetof(hfview_pages, entries));
    *done = 0;
    if (!cap || !pg->n) return 0;
    if (len > RENDER_MAX) len = RENDER_MAX;
    size_t p = page_of(pg->entry_at, npages_of(pg), off);
    uint64_t at = pg->entry_at[p], data = pg->data_at[p];
    size_t filled = 0;
    strbuf entry;
    sb_init(&entry);
    for (size_t i = p * HFVIEW_PAGE; i < pg->n && filled < len; i++) {
        const ckpt_tensor *t = &pg->cat->tensors[pg->order[i]];
        sb_clear(&entry);
        st_put_entry(&entry, t, data);
        if (entry.failed) break;
        uint64_t end = at + entry.len;
        if (end > off + filled) {
            uint64_t from = off + filled - at;
            size_t k = entry.len - from < len - filled ? (size_t)(entry.len - from) : len - filled;
            memcpy(out + filled, entry.data + from, k);
            filled += k;
        }
        at = end;
        data += t->nbytes;
    }
    sb_free(&entry);
    if (!filled) return 0;
    *done = filled;
    seg[0] = (ckpt_segment){.kind = CKPT_SEG_MEM, .mem = out, .length = filled};
    return 1;
}

/* The tensors' bytes from the page holding off on; runs adjacent in one file are merged. */
static size_t plan_data(const ckpt_vgen *g, uint64_t off, uint64_t len, ckpt_segment *seg,
                        size_t cap, uint64_t *done) {
    const hfview_pages *pg =
        (const hfview_pages *)(const void *)((const char *)g - offsetof(hfview_pages, data));
    *done = 0;
    if (!pg->n) return 0;
    size_t p = page_of(pg->data_at, npages_of(pg), off), n = 0;
    uint64_t at = pg->data_at[p], pos = off, end = off + len;
    for (size_t i = p * HFVIEW_PAGE; i < pg->n && pos < end && n < cap; i++) {
        const ckpt_tensor *t = &pg->cat->tensors[pg->order[i]];
        if (at + t->nbytes <= pos) {
            at += t->nbytes;
            continue;
        }
        uint64_t in = pos - at, want = t->nbytes - in < end - pos ? t->nbytes - in : end - pos;
        uint64_t got;
        size_t was = n;
        n += ckpt_plan(t, in, want, seg + n, cap - n, &got);
        if (was && n > was && seg[was].kind == CKPT_SEG_FILE &&
            seg[was - 1].kind == CKPT_SEG_FILE && seg[was].source == seg[was - 1].source &&
            seg[was - 1].offset + seg[was - 1].length == seg[was].offset) {
            seg[was - 1].length += seg[was].length;
            memmove(seg + was, seg + was + 1, (n - was - 1) * sizeof *seg);
            n--;
        }
        pos += got;
        if (got < want) break;
        at += t->nbytes;
    }
    *done = pos - off;
    return n;
}

static void pages_free(hfview_pages *pg) {
    if (!pg) return;
    free(pg->entry_at);
    free(pg->data_at);
    free(pg);
}

static hfview_pages *pages_new(const ckpt_catalog *cat, const uint32_t *order, size_t n) {
    hfview_pages *pg = calloc(1, sizeof *pg);
    size_t npages = (n + HFVIEW_PAGE - 1) / HFVIEW_PAGE;
    if (!pg) return NULL;
    *pg = (hfview_pages){
        .entries = {plan_entries}, .data = {plan_data}, .cat = cat, .order = order, .n = n};
    pg->entry_at = malloc((npages ? npages : 1) * sizeof *pg->entry_at);
    pg->data_at = malloc((npages ? npages : 1) * sizeof *pg->data_at);
    if (!pg->entry_at || !pg->data_at) {
        pages_free(pg);
        return NULL;
    }
    return pg;
}

void ckpt_hfview_each_tensor(const ckpt_hfview_file *f, void (*fn)(void *ctx, const ckpt_tensor *t),
                             void *ctx) {
    for (size_t p = 0; p < f->vf.nparts; p++)
        if (f->vf.parts[p].tensor) fn(ctx, f->vf.parts[p].tensor);
    for (size_t i = 0; f->pages && i < f->pages->n; i++)
        fn(ctx, &f->pages->cat->tensors[f->pages->order[i]]);
}

/* One shard: header + the tensors order[first..last). The header is measured first and then
 * written into a buffer of exactly its size: at a million tensors it is as big as the source's
 * header, and growing it by doubling held up to 3x that while copying. With `spans`, runs of
 * a source that hold the same bytes are served from it instead (ckpt_hfview_build_spans). */
static int build_shard(ckpt_hfview *v, const ckpt_catalog *cat, const size_t *order, size_t first,
                       size_t last, bool spans, ckpt_err *err) {
    ckpt_hfview_file *f = &v->files[v->nfiles - 1];
    hfview_pages *pg = spans ? pages_new(cat, v->order + first, last - first) : NULL;
    if (spans && !pg) return ckpt_fail(err, -ENOMEM, "out of memory");
    f->pages = pg; /* freed with the view, or below when the file has no use for it */
    uint32_t source = 0;
    uint64_t base = 0, entries_at = 0, header_end = 0;
    bool run = spans && data_is_one_run(cat, order, first, last, &source, &base);
    source_match m = {.cat = cat, .source = source, .ok = false};
    if (run && source_entries(cat, source, base, &entries_at, &header_end) &&
        (m.window = malloc(MATCH_WINDOW))) {
        m.pos = entries_at;
        m.end = header_end;
        m.ok = true;
    }
    strbuf entry;
    sb_init(&entry);
    size_t hlen = ST_HEADER_START_LEN + 1; /* and the closing brace */
    uint64_t at = 0, entries_len = 0;
    for (size_t i = first; i < last; i++) {
        const ckpt_tensor *t = &cat->tensors[order[i]];
        if (pg && (i - first) % HFVIEW_PAGE == 0) {
            pg->entry_at[(i - first) / HFVIEW_PAGE] = entries_len;
            pg->data_at[(i - first) / HFVIEW_PAGE] = at;
        }
        sb_clear(&entry);
        st_put_entry(&entry, t, at);
        entries_len += entry.len;
        if (m.ok && !entry.failed) /* the source has no comma before its first entry */
            match_bytes(&m, entry.data + (i == first), entry.len - (i == first));
        hlen += entry.len;
        at += t->nbytes;
    }
    free(m.window);
    hlen = st_padded_len(hlen);
    if (entry.failed) {
        sb_free(&entry);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    if (run && !(f->spans = calloc(2, sizeof *f->spans))) {
        sb_free(&entry);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    int rc = 0;
    if (m.ok && first < last) {
        /* [length]{"__metadata__":...}, | the entries, from the source | } and padding */
        static const char tail[] = "}       ";
        size_t lead = 8 + ST_HEADER_START_LEN + 1;
        uint64_t from_source = entries_len - 1; /* but the comma in front of the first */
        char *head = malloc(lead);
        if (!head) {
            sb_free(&entry);
            return ckpt_fail(err, -ENOMEM, "out of memory");
        }
        put_le64((unsigned char *)head, hlen);
        memcpy(head + 8, st_header_start, ST_HEADER_START_LEN);
        head[lead - 1] = ',';
        f->owned = head;
        span_init(&f->spans[0], source, entries_at, from_source);
        rc = ckpt_vfile_reserve(&f->vf, 4);
        if (!rc) rc = ckpt_vfile_add_mem(&f->vf, head, lead);
        if (!rc) rc = ckpt_vfile_add_tensor(&f->vf, &f->spans[0].t, 0, from_source);
        if (!rc) rc = ckpt_vfile_add_mem(&f->vf, tail, 8 + hlen - lead - from_source);
        sb_free(&entry);
    } else if (pg) {
        /* [length]{"__metadata__":...} | the entries, rendered when read | } and padding */
        static const char tail[] = "}       ";
        size_t lead = 8 + ST_HEADER_START_LEN;
        char *head = malloc(lead);
        sb_free(&entry);
        if (!head) return ckpt_fail(err, -ENOMEM, "out of memory");
        put_le64((unsigned char *)head, hlen);
        memcpy(head + 8, st_header_start, ST_HEADER_START_LEN);
        f->owned = head;
        rc = ckpt_vfile_reserve(&f->vf, 4);
        if (!rc) rc = ckpt_vfile_add_mem(&f->vf, head, lead);
        if (!rc) rc = ckpt_vfile_add_gen(&f->vf, &pg->entries, entries_len);
        if (!rc) rc = ckpt_vfile_add_mem(&f->vf, tail, 8 + hlen - lead - entries_len);
    } else {
        char *header = malloc(8 + hlen);
        if (!header) {
            sb_free(&entry);
            return ckpt_fail(err, -ENOMEM, "out of memory");
        }
        put_le64((unsigned char *)header, hlen);
        size_t pos = 8;
        memcpy(header + pos, st_header_start, ST_HEADER_START_LEN);
        pos += ST_HEADER_START_LEN;
        at = 0;
        for (size_t i = first; i < last; i++) {
            const ckpt_tensor *t = &cat->tensors[order[i]];
            sb_clear(&entry);
            st_put_entry(&entry, t, at);
            memcpy(header + pos, entry.data, entry.len);
            pos += entry.len;
            at += t->nbytes;
        }
        sb_free(&entry);
        header[pos++] = '}';
        memset(header + pos, ' ', 8 + hlen - pos);
        f->owned = header;
        rc = ckpt_vfile_reserve(&f->vf, run ? 2 : 1 + (last - first));
        if (!rc) rc = ckpt_vfile_add_mem(&f->vf, header, 8 + hlen);
    }
    if (run) {
        span_init(&f->spans[1], source, base, at);
        if (!rc) rc = ckpt_vfile_add_tensor(&f->vf, &f->spans[1].t, 0, at);
    } else if (pg) {
        if (!rc) rc = ckpt_vfile_add_gen(&f->vf, &pg->data, at);
    } else {
        for (size_t i = first; !rc && i < last; i++) {
            const ckpt_tensor *t = &cat->tensors[order[i]];
            rc = ckpt_vfile_add_tensor(&f->vf, t, 0, t->nbytes);
        }
    }
    if (pg && m.ok && run) { /* all of it from the source */
        pages_free(pg);
        f->pages = NULL;
    }
    return rc ? ckpt_fail(err, rc, "out of memory") : 0;
}

static int build_index(ckpt_hfview *v, const ckpt_catalog *cat, const size_t *order, size_t n,
                       const size_t *shard_of, size_t nshards, uint64_t total, ckpt_err *err) {
    /* transformers sorts the weight map's names in byte order, which is the catalog's order:
     * the view's tensors are picked out of it by their rank in the view order. */
    st_placed *by_name = malloc((n ? n : 1) * sizeof *by_name);
    size_t *rank = malloc((cat->ntensors ? cat->ntensors : 1) * sizeof *rank);
    if (!by_name || !rank) {
        free(by_name);
        free(rank);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < cat->ntensors; i++) rank[i] = SIZE_MAX;
    for (size_t i = 0; i < n; i++) rank[order[i]] = i;
    size_t k = 0;
    for (size_t t = 0; t < cat->ntensors; t++)
        if (rank[t] != SIZE_MAX) by_name[k++] = (st_placed){t, shard_of[rank[t]]};
    strbuf sb;
    sb_init(&sb);
    st_index_json(&sb, cat, by_name, k, nshards, total);
    free(by_name);
    free(rank);
    int rc = add_file(v, ST_INDEX_NAME, err);
    if (rc) {
        sb_free(&sb);
        return rc;
    }
    ckpt_hfview_file *f = &v->files[v->nfiles - 1];
    size_t len;
    f->owned = sb_take(&sb, &len);
    if (!f->owned) return ckpt_fail(err, -ENOMEM, "out of memory");
    return ckpt_vfile_add_mem(&f->vf, f->owned, len) ? ckpt_fail(err, -ENOMEM, "out of memory") : 0;
}

static int build_view(const ckpt_catalog *cat, uint64_t max_shard_size, bool spans, ckpt_hfview *v,
                      ckpt_err *err) {
    memset(v, 0, sizeof *v);
    size_t n = 0;
    size_t *order = malloc((cat->ntensors ? cat->ntensors : 1) * sizeof *order);
    size_t *shard_of = malloc((cat->ntensors ? cat->ntensors : 1) * sizeof *shard_of);
    if (!order || !shard_of) {
        free(order);
        free(shard_of);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    /* Only what a safetensors reader can load completely. */
    bool renamed = false;
    for (size_t i = 0; i < cat->ntensors && !renamed; i++) renamed = cat->tensors[i].hf_view;
    size_t tied = ckpt_hf_tied_head(cat); /* written once, as save_pretrained does */
    v->tied_head_left_out = tied != SIZE_MAX;
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        if (renamed ? !t->hf_view : t->aside) continue; /* per-rank copies, optimizer state */
        if (i == tied) continue;
        if (!utf8_valid(t->name, t->name_len) ||
            ckpt_safetensors_reserved_name(t->name, t->name_len)) {
            v->skipped_name++; /* safetensors names are JSON strings other than __metadata__ */
            continue;
        }
        if (!ckpt_dtype_info_of(t->dtype)->safetensors)
            v->skipped_dtype++;
        else if (t->incomplete)
            v->skipped_incomplete++;
        else
            order[n++] = i;
    }
    if (sort_view_order(cat, order, n) != 0) {
        free(order);
        free(shard_of);
        return ckpt_fail(err, -ENOMEM, "out of memory");
    }
    { /* what files with pages read their tensors from, and what the view shows */
        if (cat->ntensors >= UINT32_MAX) {
            free(order);
            free(shard_of);
            return ckpt_fail(err, -E2BIG, "%zu tensors: more than the view can index",
                             cat->ntensors);
        }
        if (!(v->order = malloc((n ? n : 1) * sizeof *v->order))) {
            free(order);
            free(shard_of);
            return ckpt_fail(err, -ENOMEM, "out of memory");
        }
        for (size_t i = 0; i < n; i++) v->order[i] = (uint32_t)order[i];
        v->norder = n;
    }

    /* Greedy packing in writer order, as huggingface_hub splits: a shard closes when the next
     * tensor would push it past the limit; a tensor bigger than the limit gets its own. */
    uint64_t total = 0, in_shard = 0;
    size_t nshards = n ? 1 : 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t b = cat->tensors[order[i]].nbytes;
        if (in_shard > 0 && max_shard_size && in_shard + b > max_shard_size) {
            nshards++;
            in_shard = 0;
        }
        in_shard += b;
        total += b;
        shard_of[i] = nshards ? nshards - 1 : 0;
    }
    int rc = 0;
    if (nshards <= 1) {
        rc = add_file(v, ST_SINGLE_NAME, err);
        if (!rc) rc = build_shard(v, cat, order, 0, n, spans, err);
    } else {
        size_t first = 0;
        for (size_t s = 0; !rc && s < nshards; s++) {
            char name[ST_SHARD_NAME_MAX];
            st_shard_name(name, s, nshards);
            size_t last = first;
            while (last < n && shard_of[last] == s) last++;
            rc = add_file(v, name, err);
            if (!rc) rc = build_shard(v, cat, order, first, last, spans, err);
            first = last;
        }
        if (!rc) rc = build_index(v, cat, order, n, shard_of, nshards, total, err);
    }
    if (!rc && cat->hf_config) {
        rc = add_file(v, "config.json", err);
        if (!rc &&
            ckpt_vfile_add_mem(&v->files[v->nfiles - 1].vf, cat->hf_config, strlen(cat->hf_config)))
            rc = ckpt_fail(err, -ENOMEM, "out of memory");
    }
    free(order);
    free(shard_of);
    if (rc) ckpt_hfview_free(v);
    return rc;
}

int ckpt_hfview_build(const ckpt_catalog *cat, uint64_t max_shard_size, ckpt_hfview *v,
                      ckpt_err *err) {
    return build_view(cat, max_shard_size, false, v, err);
}

int ckpt_hfview_build_spans(const ckpt_catalog *cat, uint64_t max_shard_size, ckpt_hfview *v,
                            ckpt_err *err) {
    return build_view(cat, max_shard_size, true, v, err);
}

void ckpt_hfview_free(ckpt_hfview *v) {
    for (size_t i = 0; i < v->nfiles; i++) {
        ckpt_vfile_free(&v->files[i].vf);
        free(v->files[i].owned);
        free(v->files[i].spans);
        pages_free(v->files[i].pages);
    }
    free(v->files);
    free(v->order);
    memset(v, 0, sizeof *v);
}
