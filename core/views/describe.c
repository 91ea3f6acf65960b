/* The documents a mount shows about its checkpoint: sidecars, summary, metadata, tensor table. */
#include "../model/catalog.h"
#include "../util/text.h"
#include "../util/search.h"
#include "../util/strbuf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void put_u64_array(strbuf *sb, const uint64_t *v, uint32_t n) {
    sb_putc(sb, '[');
    for (uint32_t i = 0; i < n; i++) {
        if (i) sb_puts(sb, ", ");
        sb_u64(sb, v[i]);
    }
    sb_putc(sb, ']');
}

static uint64_t piece_bytes(const ckpt_tensor *t, const ckpt_piece *p) {
    uint64_t numel = 1, extent = 1;
    for (uint32_t d = 0; d < t->ndim; d++) numel *= p->sizes[d];
    if (numel == 0) return 0;
    if (p->strides)
        for (uint32_t d = 0; d < t->ndim; d++) extent += (p->sizes[d] - 1) * p->strides[d];
    else
        extent = numel;
    const ckpt_dtype_info *dt = ckpt_dtype_info_of(t->dtype);
    return (extent + dt->block - 1) / dt->block * dt->block_bytes;
}

char *ckpt_sidecar_json(const ckpt_catalog *cat, const ckpt_tensor *t, size_t *len) {
    return ckpt_sidecar_json_as(cat, t, false, len);
}

char *ckpt_sidecar_json_as(const ckpt_catalog *cat, const ckpt_tensor *t, bool as_f32,
                           size_t *len) {
    const ckpt_dtype_info *dt = ckpt_dtype_info_of(as_f32 ? CKPT_F32 : t->dtype);
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "{\n  \"name\": ");
    sb_json_str(&sb, t->name, t->name_len);
    sb_printf(&sb, ",\n  \"dtype\": \"%s\",\n  \"shape\": ", dt->name);
    put_u64_array(&sb, t->shape, t->ndim);
    sb_puts(&sb, ",\n  \"nbytes\": ");
    sb_u64(&sb, as_f32 ? t->numel * 4 : t->nbytes);
    sb_printf(&sb, ",\n  \"byte_order\": \"little\",\n  \"format\": \"%s\"", cat->format);
    if (dt->numpy) sb_printf(&sb, ",\n  \"numpy_dtype\": \"%s\"", dt->numpy);
    if (t->incomplete) sb_puts(&sb, ",\n  \"incomplete\": true");
    if (t->aside) sb_puts(&sb, ",\n  \"aside\": true");
    if (as_f32)
        sb_printf(&sb,
                  ",\n  \"stored_dtype\": \"%s\",\n  \"stored_nbytes\": %llu,\n  "
                  "\"converted_on_read\": true",
                  ckpt_dtype_info_of(t->dtype)->name, (unsigned long long)t->nbytes);
    if (t->extra) {
        sb_puts(&sb, ",\n  ");
        ckpt_tensor_extra(t, &sb);
    }
    sb_puts(&sb, ",\n  \"sources\": [");
    bool whole = t->npieces == 1 && !t->index;
    for (uint32_t k = 0; k < t->npieces; k++) {
        const ckpt_piece *p = &t->pieces[k];
        sb_puts(&sb, k ? ",\n    {\"file\": " : "\n    {\"file\": ");
        /* A tar member's bytes are named by the archive and their offset in it, so that the
         * sidecar alone still says where to read them. */
        const ckpt_source *src = &cat->sources[p->source];
        const char *rel = src->member_of ? src->member_of : src->relpath;
        sb_json_str(&sb, rel, strlen(rel));
        if (src->member_of) {
            sb_puts(&sb, ", \"member\": ");
            sb_json_str(&sb, src->relpath, strlen(src->relpath));
        }
        sb_puts(&sb, ", \"offset\": ");
        sb_u64(&sb, src->base + p->file_offset);
        sb_puts(&sb, ", \"length\": ");
        sb_u64(&sb, piece_bytes(t, p));
        if (!whole && t->ndim) {
            sb_puts(&sb, ", \"box\": {\"offsets\": ");
            put_u64_array(&sb, p->offsets, t->ndim);
            sb_puts(&sb, ", \"sizes\": ");
            put_u64_array(&sb, p->sizes, t->ndim);
            sb_putc(&sb, '}');
            if (p->strides) {
                sb_puts(&sb, ", \"strides\": ");
                put_u64_array(&sb, p->strides, t->ndim);
            }
        }
        sb_putc(&sb, '}');
    }
    sb_puts(&sb, t->npieces ? "\n  ]\n}\n" : "]\n}\n");
    return sb_take(&sb, len);
}

char *ckpt_summary_json(const ckpt_catalog *cat, size_t *len) {
    return ckpt_summary_json_marked(cat, NULL, len);
}

char *ckpt_summary_json_marked(const ckpt_catalog *cat, const bool *marked, size_t *len) {
    uint64_t params = 0, bytes = 0, by_dtype[CKPT_DTYPE_COUNT] = {0};
    size_t count_dtype[CKPT_DTYPE_COUNT] = {0}, incomplete = 0, model = 0, copies = 0;
    uint64_t alias_params = 0;
    bool *alias = NULL;
    size_t aliases = 0;
    if (!marked) {
        if (!(alias = calloc(cat->ntensors ? cat->ntensors : 1, sizeof *alias))) return NULL;
        aliases = ckpt_mark_aliases(cat, alias);
        marked = alias;
    } else {
        for (size_t i = 0; i < cat->ntensors; i++) aliases += marked[i];
    }
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        if (t->aside) {
            copies++;
            continue;
        }
        model++;
        if (marked[i])
            alias_params += t->numel; /* its storage is another tensor's: counted there */
        else
            params += t->numel;
        bytes += t->nbytes;
        by_dtype[t->dtype] += t->nbytes;
        count_dtype[t->dtype]++;
        incomplete += t->incomplete;
    }
    strbuf sb;
    sb_init(&sb);
    sb_printf(&sb, "{\n  \"format\": \"%s\",\n  ", cat->format);
    if (cat->summary_extra) {
        sb_puts(&sb, cat->summary_extra);
        sb_puts(&sb, ",\n  ");
    }
    sb_puts(&sb, "\"source\": ");
    sb_json_str(&sb, cat->root, strlen(cat->root));
    sb_puts(&sb, ",\n  \"files\": [");
    for (uint32_t i = 0; i < cat->nsources; i++) {
        const ckpt_source *s = &cat->sources[i];
        sb_puts(&sb, i ? ",\n    {\"path\": " : "\n    {\"path\": ");
        sb_json_str(&sb, s->relpath, strlen(s->relpath));
        sb_puts(&sb, ", \"size\": ");
        sb_u64(&sb, s->size);
        if (s->member_of) {
            sb_puts(&sb, ", \"in_archive\": ");
            sb_json_str(&sb, s->member_of, strlen(s->member_of));
            sb_puts(&sb, ", \"offset\": ");
            sb_u64(&sb, s->base);
        }
        sb_putc(&sb, '}');
    }
    sb_printf(&sb, "%s],\n  \"tensor_count\": %zu,\n  \"parameter_count\": ",
              cat->nsources ? "\n  " : "", model);
    sb_u64(&sb, params);
    sb_printf(&sb, ",\n  \"alias_count\": %zu,\n  \"alias_parameters\": ", aliases);
    sb_u64(&sb, alias_params);
    free(alias);
    sb_puts(&sb, ",\n  \"total_bytes\": ");
    sb_u64(&sb, bytes);
    sb_puts(&sb, ",\n  \"dtypes\": {");
    bool first = true;
    for (int d = 0; d < CKPT_DTYPE_COUNT; d++) {
        if (!count_dtype[d]) continue;
        sb_printf(&sb, "%s\n    \"%s\": {\"tensors\": %zu, \"bytes\": ", first ? "" : ",",
                  ckpt_dtype_info_of((ckpt_dtype)d)->name, count_dtype[d]);
        sb_u64(&sb, by_dtype[d]);
        sb_putc(&sb, '}');
        first = false;
    }
    sb_printf(&sb, "%s},\n  \"incomplete_tensors\": %zu,\n", first ? "" : "\n  ", incomplete);
    if (copies) sb_printf(&sb, "  \"tensors_outside_the_model\": %zu,\n", copies);
    sb_puts(&sb, "  \"warnings\": [");
    for (size_t i = 0; i < cat->nwarnings; i++) {
        sb_puts(&sb, i ? ",\n    " : "\n    ");
        sb_json_str(&sb, cat->warnings[i], strlen(cat->warnings[i]));
    }
    sb_puts(&sb, cat->nwarnings ? "\n  ]\n}\n" : "]\n}\n");
    return sb_take(&sb, len);
}

char *ckpt_metadata_json(const ckpt_catalog *cat, size_t *len) {
    strbuf sb;
    sb_init(&sb);
    sb_printf(&sb, "{\n  \"format\": \"%s\"", cat->format);
    for (size_t i = 0; i < cat->ndocs; i++) {
        sb_puts(&sb, ",\n  ");
        sb_json_str(&sb, cat->docs[i].key, strlen(cat->docs[i].key));
        sb_puts(&sb, ": ");
        sb_put(&sb, cat->docs[i].json, cat->docs[i].len);
    }
    sb_puts(&sb, "\n}\n");
    return sb_take(&sb, len);
}

static const char tsv_head[] = "name\tdtype\tshape\tnbytes\tpath\n";

static void tsv_line(strbuf *sb, const ckpt_tensor *t) {
    text_pct_escape(sb, t->name, t->name_len, false); /* no tab or newline in a field */
    sb_printf(sb, "\t%s\t[", ckpt_dtype_info_of(t->dtype)->name);
    for (uint32_t d = 0; d < t->ndim; d++) {
        if (d) sb_putc(sb, ',');
        sb_u64(sb, t->shape[d]);
    }
    sb_puts(sb, "]\t");
    sb_u64(sb, t->nbytes);
    sb_putc(sb, '\t');
    sb_puts(sb, t->path); /* already escaped: no control bytes */
    sb_putc(sb, '\n');
}

char *ckpt_tensors_tsv(const ckpt_catalog *cat, size_t *len) {
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, tsv_head);
    for (size_t i = 0; i < cat->ntensors; i++) tsv_line(&sb, &cat->tensors[i]);
    return sb_take(&sb, len);
}

/* Page k holds the lines of tensors [k * CKPT_TSV_PAGE, (k + 1) * CKPT_TSV_PAGE) and starts at
 * start[k]; the heading line comes before page 0. */
struct ckpt_tsv_pages {
    const ckpt_catalog *cat;
    size_t npages;
    uint64_t size;
    uint64_t start[];
};

ckpt_tsv_pages *ckpt_tsv_pages_new(const ckpt_catalog *cat) {
    size_t npages = (cat->ntensors + CKPT_TSV_PAGE - 1) / CKPT_TSV_PAGE;
    ckpt_tsv_pages *p = malloc(sizeof *p + (npages + 1) * sizeof p->start[0]);
    if (!p) return NULL;
    *p = (ckpt_tsv_pages){.cat = cat, .npages = npages};
    strbuf sb;
    sb_init(&sb);
    uint64_t at = sizeof tsv_head - 1;
    for (size_t i = 0; i < cat->ntensors; i++) {
        if (i % CKPT_TSV_PAGE == 0) p->start[i / CKPT_TSV_PAGE] = at;
        sb_clear(&sb);
        tsv_line(&sb, &cat->tensors[i]);
        at += sb.len;
    }
    bool failed = sb.failed;
    sb_free(&sb);
    if (failed) {
        free(p);
        return NULL;
    }
    p->start[npages] = at;
    p->size = at;
    return p;
}

uint64_t ckpt_tsv_pages_size(const ckpt_tsv_pages *p) {
    return p->size;
}

ssize_t ckpt_tsv_pages_read(const ckpt_tsv_pages *p, uint64_t off, char *dst, size_t len) {
    if (off >= p->size || len == 0) return 0;
    if (len > p->size - off) len = (size_t)(p->size - off);
    size_t done = 0;
    if (off < sizeof tsv_head - 1) {
        done = sizeof tsv_head - 1 - (size_t)off < len ? sizeof tsv_head - 1 - (size_t)off : len;
        memcpy(dst, tsv_head + off, done);
    }
    size_t lo = last_at_or_before(p->start, p->npages, off + done);
    strbuf sb;
    sb_init(&sb);
    uint64_t at = p->npages ? p->start[lo] : p->size;
    for (size_t i = lo * CKPT_TSV_PAGE; i < p->cat->ntensors && done < len; i++) {
        sb_clear(&sb);
        tsv_line(&sb, &p->cat->tensors[i]);
        if (sb.failed) break;
        uint64_t end = at + sb.len;
        if (end > off + done) {
            size_t skip = (size_t)(off + done - at);
            size_t take = sb.len - skip < len - done ? sb.len - skip : len - done;
            memcpy(dst + done, sb.data + skip, take);
            done += take;
        }
        at = end;
    }
    bool failed = sb.failed;
    sb_free(&sb);
    return failed ? -ENOMEM : (ssize_t)done;
}

void ckpt_tsv_pages_free(ckpt_tsv_pages *p) {
    free(p);
}
