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
#include "le.h"

#include "catalog.h"
#include "strbuf.h"
#include "utf8.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    const ckpt_tensor *x = &((const ckpt_catalog *)cat)->tensors[*(const size_t *)a];
    const ckpt_tensor *y = &((const ckpt_catalog *)cat)->tensors[*(const size_t *)b];
    size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
    int c = memcmp(x->name, y->name, n);
    return c ? c : (x->name_len > y->name_len) - (x->name_len < y->name_len);
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

/* One shard: header + the tensors order[first..last). */
static int build_shard(ckpt_hfview *v, const ckpt_catalog *cat, const size_t *order, size_t first,
                       size_t last, ckpt_err *err) {
    ckpt_hfview_file *f = &v->files[v->nfiles - 1];
    strbuf sb;
    sb_init(&sb);
    /* The length goes in front once known: the header is built in place, not copied (at a
     * million tensors it is as big as the source's header). */
    sb_put(&sb, "\0\0\0\0\0\0\0\0", 8);
    sb_puts(&sb, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t at = 0;
    for (size_t i = first; i < last; i++) {
        const ckpt_tensor *t = &cat->tensors[order[i]];
        sb_putc(&sb, ',');
        sb_json_str(&sb, t->name, t->name_len);
        sb_puts(&sb, ":{\"dtype\":\"");
        sb_puts(&sb, ckpt_dtype_info_of(t->dtype)->name);
        sb_puts(&sb, "\",\"shape\":[");
        for (uint32_t d = 0; d < t->ndim; d++) {
            if (d) sb_putc(&sb, ',');
            sb_u64(&sb, t->shape[d]);
        }
        sb_puts(&sb, "],\"data_offsets\":[");
        sb_u64(&sb, at);
        sb_putc(&sb, ',');
        sb_u64(&sb, at + t->nbytes);
        sb_puts(&sb, "]}");
        at += t->nbytes;
    }
    sb_putc(&sb, '}');
    while (sb.len % 8) sb_putc(&sb, ' ');
    size_t total;
    char *header = sb_take(&sb, &total);
    if (!header) return ckpt_fail(err, -ENOMEM, "out of memory");
    size_t hlen = total - 8;
    put_le64((unsigned char *)header, hlen);
    f->owned = header;
    int rc = ckpt_vfile_add_mem(&f->vf, header, 8 + hlen);
    for (size_t i = first; !rc && i < last; i++) {
        const ckpt_tensor *t = &cat->tensors[order[i]];
        rc = ckpt_vfile_add_tensor(&f->vf, t, 0, t->nbytes);
    }
    return rc ? ckpt_fail(err, rc, "out of memory") : 0;
}

static int build_index(ckpt_hfview *v, const ckpt_catalog *cat, const size_t *order, size_t n,
                       const size_t *shard_of, uint64_t total, ckpt_err *err) {
    /* transformers writes json.dumps(index, indent=2, sort_keys=True): names in byte order,
     * which is the catalog's order. */
    size_t *by_name = malloc((n ? n : 1) * sizeof *by_name);
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
        if (rank[t] != SIZE_MAX) by_name[k++] = t;
    strbuf sb;
    sb_init(&sb);
    sb_puts(&sb, "{\n  \"metadata\": {\n    \"total_size\": ");
    sb_u64(&sb, total);
    sb_puts(&sb, "\n  },\n  \"weight_map\": {");
    for (size_t i = 0; i < k; i++) {
        const ckpt_tensor *t = &cat->tensors[by_name[i]];
        sb_puts(&sb, i ? ",\n    " : "\n    ");
        sb_json_str(&sb, t->name, t->name_len);
        sb_puts(&sb, ": ");
        const char *shard = v->files[shard_of[rank[by_name[i]]]].name;
        sb_json_str(&sb, shard, strlen(shard));
    }
    sb_puts(&sb, k ? "\n  }\n}\n" : "}\n}\n");
    free(by_name);
    free(rank);
    int rc = add_file(v, "model.safetensors.index.json", err);
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

int ckpt_hfview_build(const ckpt_catalog *cat, uint64_t max_shard_size, ckpt_hfview *v,
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
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        if (renamed ? !t->hf_view : t->aside) continue; /* per-rank copies, optimizer state */
        if (!utf8_valid(t->name, t->name_len)) {
            v->skipped_name++; /* safetensors names are JSON strings */
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
        rc = add_file(v, "model.safetensors", err);
        if (!rc) rc = build_shard(v, cat, order, 0, n, err);
    } else {
        size_t first = 0;
        for (size_t s = 0; !rc && s < nshards; s++) {
            char name[64];
            snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, nshards);
            size_t last = first;
            while (last < n && shard_of[last] == s) last++;
            rc = add_file(v, name, err);
            if (!rc) rc = build_shard(v, cat, order, first, last, err);
            first = last;
        }
        if (!rc) rc = build_index(v, cat, order, n, shard_of, total, err);
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

void ckpt_hfview_free(ckpt_hfview *v) {
    for (size_t i = 0; i < v->nfiles; i++) {
        ckpt_vfile_free(&v->files[i].vf);
        free(v->files[i].owned);
    }
    free(v->files);
    memset(v, 0, sizeof *v);
}
