/* libFuzzer harness: the Hugging Face view (core/views/hfview.c) and the tree paths and documents
 * of a catalog built by hand from the input — names with '.', '/', '%', control bytes, NUL and
 * multi-byte characters, every dtype, holes, replicas, tensors set aside under a prefix — and a
 * max_shard_size from the input.
 *
 * Checked: the view holds exactly the complete, safetensors-typed model tensors, each once, under
 * its exact name, dtype and shape; headers are valid JSON padded to 8 bytes with data offsets
 * tiling the data; each tensor's bytes in the view are its bytes; shards are packed greedily in
 * order (a shard is closed only when the next tensor would pass the limit); the index maps every
 * name to its shard and totals the bytes. Plus everything fz_exercise checks. */
#include "fuzz_common.h"

enum { SOURCE_SIZE = 1 << 16, MAX_TENSORS = 8 };

typedef struct reader {
    const uint8_t *d;
    size_t n, at;
} reader;

static unsigned u8(reader *r) {
    return r->at < r->n ? r->d[r->at++] : 0;
}

static char source_path[600];

static void make_source(void) {
    if (source_path[0]) return;
    snprintf(source_path, sizeof source_path, "%s/src", fz_fresh_dir());
    static uint8_t bytes[SOURCE_SIZE];
    for (uint32_t i = 0; i < SOURCE_SIZE; i++) bytes[i] = (uint8_t)((i * 2654435761u) >> 13);
    fz_write_file(source_path, bytes, sizeof bytes);
}

/* A name of valid UTF-8 (what decoders let through), rich in separators and escapes. */
static size_t make_name(reader *r, char *out) {
    static const char *const parts[] = {
        "a",  "b",    "w",  ".",   "/",    "%",        "",
        "\n", "\x7f", " ",  "\"",  "\\",   "\xc3\xa9", "\xe2\x98\x83",
        "0",  "%25",  "..", "raw", "json", "\x01"};
    size_t n = 0, count = u8(r) % 10;
    for (size_t i = 0; i < count; i++) {
        unsigned k = u8(r) % (sizeof parts / sizeof *parts);
        size_t len = k == 6 ? 1 : strlen(parts[k]); /* parts[6]: a NUL byte */
        memcpy(out + n, parts[k], len);
        n += len;
    }
    return n;
}

static uint64_t le64(const uint8_t *p) {
    return fz_le64(p);
}

static const ckpt_tensor *find_tensor(const ckpt_catalog *cat, const char *name, size_t len) {
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        if (!t->aside && t->name_len == len && !memcmp(t->name, name, len)) return t;
    }
    return NULL;
}

static bool in_view(const ckpt_tensor *t) {
    return !t->aside && ckpt_dtype_info_of(t->dtype)->safetensors && !t->incomplete;
}

static uint8_t view_bytes[SOURCE_SIZE * 4], tensor_bytes[SOURCE_SIZE];

/* One shard: returns the tensors it holds in order; fills seen[]. */
static size_t check_shard(const ckpt_catalog *cat, const ckpt_hfview_file *f, int *seen, int shard,
                          const ckpt_tensor **order, uint64_t *bytes) {
    const ckpt_vfile *vf = &f->vf;
    FZ_CHECK(vf->size <= sizeof view_bytes, "view file of %llu bytes",
             (unsigned long long)vf->size);
    fz_read_range(cat, fz_plan_vfile, vf, f->name, vf->size, 0, vf->size, false, view_bytes);
    FZ_CHECK(vf->size >= 8, "%s: %llu bytes", f->name, (unsigned long long)vf->size);
    uint64_t hlen = le64(view_bytes);
    FZ_CHECK(hlen % 8 == 0 && hlen <= vf->size - 8, "%s: header length %llu", f->name,
             (unsigned long long)hlen);
    const char *hdr = (const char *)view_bytes + 8;
    json_doc doc;
    json_error e;
    if (json_parse(&doc, hdr, hlen, &e) != 0)
        fz_die("%s: header is not JSON: %s at %zu: %.*s", f->name, e.msg, e.pos, (int)hlen, hdr);
    FZ_CHECK(hlen == 0 || hdr[hlen - 1] == ' ' || hdr[hlen - 1] == '}', "%s: header padding",
             f->name);
    const json_value *meta = json_member(doc.root, "__metadata__");
    FZ_CHECK(doc.root->type == JSON_OBJECT && meta && meta->type == JSON_OBJECT &&
                 meta->count == 1 && json_str_eq(json_member(meta, "format"), "pt"),
             "%s: __metadata__ is not {\"format\": \"pt\"}", f->name);
    const uint8_t *data = view_bytes + 8 + hlen;
    uint64_t at = 0, data_len = vf->size - 8 - hlen;
    size_t n = 0;
    for (const json_value *m = doc.root->head; m; m = m->next) {
        if (m == meta) continue;
        const ckpt_tensor *t = find_tensor(cat, m->key, m->key_len);
        FZ_CHECK(t, "%s: \"%.*s\" is no model tensor", f->name, (int)m->key_len, m->key);
        size_t ti = (size_t)(t - cat->tensors);
        FZ_CHECK(in_view(t), "%s: \"%.*s\" should not be in the view", f->name, (int)m->key_len,
                 m->key);
        FZ_CHECK(seen[ti] < 0, "\"%.*s\" is in %s and shard %d", (int)m->key_len, m->key, f->name,
                 seen[ti]);
        seen[ti] = shard;
        order[n++] = t;
        FZ_CHECK(json_str_eq(json_member(m, "dtype"), ckpt_dtype_info_of(t->dtype)->name),
                 "%s: \"%.*s\" dtype", f->name, (int)m->key_len, m->key);
        const json_value *shape = json_member(m, "shape");
        FZ_CHECK(shape && shape->type == JSON_ARRAY && shape->count == t->ndim, "%s: shape",
                 f->name);
        const json_value *dim = shape->head;
        for (uint32_t d = 0; d < t->ndim; d++, dim = dim->next) {
            uint64_t v;
            FZ_CHECK(json_as_u64(dim, &v) && v == t->shape[d], "%s: shape[%u]", f->name, d);
        }
        const json_value *o = json_member(m, "data_offsets");
        uint64_t a, b;
        FZ_CHECK(o && o->type == JSON_ARRAY && o->count == 2 && json_as_u64(o->head, &a) &&
                     json_as_u64(o->head->next, &b) && a == at && b - a == t->nbytes &&
                     b <= data_len,
                 "%s: \"%.*s\" data_offsets", f->name, (int)m->key_len, m->key);
        FZ_CHECK(t->nbytes <= sizeof tensor_bytes, "tensor of %llu bytes",
                 (unsigned long long)t->nbytes);
        fz_read_range(cat, fz_plan_tensor, t, "tensor", t->nbytes, 0, t->nbytes, false,
                      tensor_bytes);
        FZ_CHECK(!memcmp(data + a, tensor_bytes, t->nbytes),
                 "%s: bytes of \"%.*s\" differ from the tensor's", f->name, (int)m->key_len,
                 m->key);
        at = b;
    }
    FZ_CHECK(at == data_len, "%s: tensors cover %llu of %llu data bytes", f->name,
             (unsigned long long)at, (unsigned long long)data_len);
    json_doc_free(&doc);
    *bytes = at;
    return n;
}

static void check_index(const ckpt_catalog *cat, const ckpt_hfview *v, const int *seen,
                        uint64_t total) {
    const ckpt_hfview_file *f = &v->files[v->nfiles - 1];
    FZ_CHECK(!strcmp(f->name, "model.safetensors.index.json"), "last file is %s", f->name);
    const ckpt_vfile *vf = &f->vf;
    FZ_CHECK(vf->size <= sizeof view_bytes, "index of %llu bytes", (unsigned long long)vf->size);
    fz_read_range(cat, fz_plan_vfile, vf, f->name, vf->size, 0, vf->size, false, view_bytes);
    json_doc doc;
    json_error e;
    if (json_parse(&doc, (const char *)view_bytes, vf->size, &e) != 0)
        fz_die("index is not JSON: %s at %zu", e.msg, e.pos);
    uint64_t ts;
    FZ_CHECK(json_as_u64(json_member(json_member(doc.root, "metadata"), "total_size"), &ts) &&
                 ts == total,
             "index total_size is not %llu", (unsigned long long)total);
    const json_value *wm = json_member(doc.root, "weight_map");
    FZ_CHECK(wm && wm->type == JSON_OBJECT, "index has no weight_map");
    size_t entries = 0;
    for (const json_value *m = wm->head; m; m = m->next, entries++) {
        const ckpt_tensor *t = find_tensor(cat, m->key, m->key_len);
        FZ_CHECK(t && seen[t - cat->tensors] >= 0, "index names \"%.*s\", not in any shard",
                 (int)m->key_len, m->key);
        const char *shard = v->files[seen[t - cat->tensors]].name;
        FZ_CHECK(json_str_eq(m, shard), "index puts \"%.*s\" in the wrong shard", (int)m->key_len,
                 m->key);
    }
    size_t in = 0;
    for (size_t i = 0; i < cat->ntensors; i++) in += seen[i] >= 0;
    FZ_CHECK(entries == in, "index has %zu entries for %zu tensors", entries, in);
    json_doc_free(&doc);
}

static void check_view(const ckpt_catalog *cat, uint64_t max_shard) {
    ckpt_hfview v;
    ckpt_err err;
    FZ_CHECK(ckpt_hfview_build(cat, max_shard, &v, &err) == 0, "view: %s", err.msg);
    uint64_t limit = max_shard ? max_shard : UINT64_MAX; /* 0: never split */
    int seen[MAX_TENSORS];
    size_t want = 0, skipped_dtype = 0, skipped_incomplete = 0;
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        seen[i] = -1;
        want += in_view(t);
        if (!t->aside && !ckpt_dtype_info_of(t->dtype)->safetensors)
            skipped_dtype++;
        else if (!t->aside && t->incomplete)
            skipped_incomplete++;
    }
    FZ_CHECK(v.skipped_dtype == skipped_dtype && v.skipped_incomplete == skipped_incomplete,
             "skipped %zu/%zu, expected %zu/%zu", v.skipped_dtype, v.skipped_incomplete,
             skipped_dtype, skipped_incomplete);
    FZ_CHECK(v.nfiles >= 1, "view without files");
    size_t nshards = v.nfiles == 1 ? 1 : v.nfiles - 1;
    if (v.nfiles == 1)
        FZ_CHECK(!strcmp(v.files[0].name, "model.safetensors"), "single file %s", v.files[0].name);
    else
        FZ_CHECK(nshards >= 2, "%zu shards with an index", nshards);
    uint64_t total = 0, prev_bytes = 0;
    size_t got = 0;
    for (size_t s = 0; s < nshards; s++) {
        if (nshards > 1) {
            char name[64];
            snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, nshards);
            FZ_CHECK(!strcmp(v.files[s].name, name), "shard %zu is %s", s, v.files[s].name);
        }
        const ckpt_tensor *order[MAX_TENSORS];
        uint64_t bytes;
        size_t n = check_shard(cat, &v.files[s], seen, (int)s, order, &bytes);
        if (nshards > 1) {
            FZ_CHECK(n >= 1, "shard %zu is empty", s);
            size_t with_bytes = 0;
            for (size_t i = 0; i < n; i++) with_bytes += order[i]->nbytes > 0;
            /* Over the limit only as the one tensor too big for any shard (zero-byte tensors
             * may share its shard). */
            FZ_CHECK(with_bytes <= 1 || bytes <= limit, "shard %zu holds %llu bytes > %llu", s,
                     (unsigned long long)bytes, (unsigned long long)limit);
            FZ_CHECK(s == 0 || prev_bytes == 0 || prev_bytes + order[0]->nbytes > limit,
                     "shard %zu was closed at %llu bytes though its successor's first tensor "
                     "(%llu) fits under %llu",
                     s - 1, (unsigned long long)prev_bytes, (unsigned long long)order[0]->nbytes,
                     (unsigned long long)limit);
        }
        prev_bytes = bytes;
        total += bytes;
        got += n;
    }
    FZ_CHECK(got == want, "view holds %zu tensors, expected %zu", got, want);
    if (nshards > 1) check_index(cat, &v, seen, total);
    ckpt_hfview_free(&v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    make_source();
    reader r = {data, size, 0};
    ckpt_catalog *cat = catalog_new("/fuzz", "fuzz");
    ckpt_err err;
    uint32_t src;
    FZ_CHECK(cat && catalog_add_source(cat, source_path, "src", &src, &err) == 0, "source");
    static const char *const prefixes[] = {".ckptfs/ranks/0/", ".ckptfs/ranks/1/", "optim/"};
    int rc = 0;
    for (unsigned k = 1 + u8(&r) % MAX_TENSORS; k > 0 && !rc; k--) {
        char name[64];
        size_t name_len = make_name(&r, name);
        ckpt_dtype dt = (ckpt_dtype)(u8(&r) % CKPT_DTYPE_COUNT);
        uint32_t ndim = u8(&r) % 4;
        uint64_t shape[3];
        for (uint32_t d = 0; d < ndim; d++) shape[d] = u8(&r) % 5;
        if (ndim) shape[ndim - 1] *= ckpt_dtype_info_of(dt)->block;
        size_t ti;
        if (catalog_add_tensor(cat, name, name_len, dt, ndim, shape, &ti, &err)) continue;
        uint64_t nbytes = cat->tensors[ti].nbytes;
        uint64_t at = nbytes < SOURCE_SIZE ? (u8(&r) * 257u) % (SOURCE_SIZE - nbytes + 1) : 0;
        switch (u8(&r) % 5) {
        case 0: /* no bytes anywhere */
            break;
        case 1: /* the first half of dim 0 only */
            if (ndim && shape[0] > 1) {
                uint64_t half[3];
                memcpy(half, shape, sizeof half);
                half[0] = shape[0] / 2;
                rc = catalog_add_piece(cat, ti, src, at, NULL, half, NULL, &err);
                break;
            }
            /* fall through */
        case 2: /* replicas */
            rc = catalog_add_piece(cat, ti, src, at, NULL, NULL, NULL, &err);
            /* fall through */
        default:
            if (!rc) rc = catalog_add_piece(cat, ti, src, at, NULL, NULL, NULL, &err);
        }
        if (!rc && u8(&r) % 6 == 0)
            rc = catalog_set_prefix(cat, ti, prefixes[u8(&r) % 3], true, &err);
    }
    if (!rc) rc = catalog_finish(cat, &err);
    if (!rc) {
        static const uint64_t limits[] = {CKPT_HF_MAX_SHARD_DEFAULT, 0, 1, 8, 24, 64, 100, 1000};
        uint64_t max_shard = limits[u8(&r) % 8];
        check_view(cat, max_shard);
        fz_exercise(cat, max_shard);
    } else {
        FZ_CHECK(err.msg[0], "refused without a message");
    }
    ckpt_close(cat);
    return 0;
}
