/* Shared pieces of the libFuzzer harnesses: turning the input into files (decoders read
 * through file descriptors), and exercising an opened catalog the way the mount does — plan and
 * read every tensor, every document, the HF view — while checking the invariants a reader
 * relies on. A broken invariant aborts with a message, which libFuzzer records as a crash.
 *
 * Inputs are either the raw bytes of one file, or a pack of several files (directory formats,
 * split files):
 *   "CKFZPACK" then records { u8 name_len; name; u32le data_len; data }
 * Names are [A-Za-z0-9._-] components, at most one directory level ("sharded/x"). A record whose
 * data_len runs past the input takes what is left. tests/fuzz/make_corpus.py writes packs. */
#ifndef CKPTFS_FUZZ_COMMON_H
#define CKPTFS_FUZZ_COMMON_H

#include "model/catalog.h"
#include "formats/formats.h"
#include "views/hfview.h"
#include "util/json.h"
#include "read/segread.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FZ_PACK_MAGIC "CKFZPACK"
enum { FZ_PACK_MAGIC_LEN = 8, FZ_MAX_FILES = 16, FZ_MAX_NAME = 64 };

/* Bytes read from sources per input: keeps one input well under the -timeout even when a
 * hostile catalog maps terabytes of logical bytes onto a few file bytes (stride 0). */
enum { FZ_READ_BUDGET = 4u << 20, FZ_CHUNK = 128u << 10, FZ_SEGS = 64 };

static inline void fz_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static inline void fz_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("\n*** ckptfs fuzz invariant broken: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

#define FZ_CHECK(cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond)) fz_die(__VA_ARGS__);                                                          \
    } while (0)

/* ---- scratch directory: one per process, emptied before every input ---- */

static char fz_root[256];

static inline void fz_rm_tree(const char *dir, int depth) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[512];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) == 0 || errno != EISDIR) continue;
        if (depth < 4) fz_rm_tree(path, depth + 1);
        rmdir(path);
    }
    closedir(d);
}

static inline void fz_cleanup(void) {
    if (!fz_root[0]) return;
    fz_rm_tree(fz_root, 0);
    rmdir(fz_root);
}

/* The per-process scratch directory, emptied. $CKPTFS_FUZZ_TMP (run.sh sets it) or /dev/shm. */
static inline const char *fz_fresh_dir(void) {
    if (!fz_root[0]) {
        const char *base = getenv("CKPTFS_FUZZ_TMP");
        if (!base || !*base) base = "/dev/shm";
        mkdir(base, 0700);
        snprintf(fz_root, sizeof fz_root, "%s/ckptfs-fuzz-%d", base, (int)getpid());
        if (mkdir(fz_root, 0700) != 0 && errno != EEXIST)
            fz_die("mkdir %s: %s", fz_root, strerror(errno));
        atexit(fz_cleanup);
    }
    fz_rm_tree(fz_root, 0);
    return fz_root;
}

static inline void fz_write_file(const char *path, const uint8_t *p, size_t n) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    FZ_CHECK(fd >= 0, "open %s: %s", path, strerror(errno));
    size_t at = 0;
    while (at < n) {
        ssize_t w = write(fd, p + at, n - at);
        FZ_CHECK(w > 0, "write %s: %s", path, strerror(errno));
        at += (size_t)w;
    }
    close(fd);
}

static inline bool fz_name_ok(const char *name, size_t n) {
    if (n == 0 || n > FZ_MAX_NAME) return false;
    int slashes = 0;
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i == n || name[i] == '/') {
            size_t len = i - start;
            if (len == 0 || (len == 1 && name[start] == '.') ||
                (len == 2 && name[start] == '.' && name[start + 1] == '.'))
                return false;
            if (i < n && ++slashes > 1) return false;
            start = i + 1;
            continue;
        }
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return false;
    }
    return true;
}

static inline bool fz_is_pack(const uint8_t *d, size_t n) {
    return n >= FZ_PACK_MAGIC_LEN && memcmp(d, FZ_PACK_MAGIC, FZ_PACK_MAGIC_LEN) == 0;
}

/* Writes the files of a pack into dir. *first gets the first file's name. Returns the number of
 * files, or -1 for a malformed pack (a bad name: the input is rejected). */
static inline int fz_unpack(const char *dir, const uint8_t *d, size_t n,
                            char first[FZ_MAX_NAME + 1]) {
    size_t at = FZ_PACK_MAGIC_LEN;
    int files = 0;
    first[0] = '\0';
    while (at < n && files < FZ_MAX_FILES) {
        size_t nl = d[at++];
        if (nl > n - at || !fz_name_ok((const char *)d + at, nl)) return -1;
        char name[FZ_MAX_NAME + 1];
        memcpy(name, d + at, nl);
        name[nl] = '\0';
        at += nl;
        size_t len = 0;
        for (int i = 0; i < 4 && at < n; i++) len |= (size_t)d[at++] << (8 * i);
        if (len > n - at) len = n - at;
        char path[512];
        char *slash = strchr(name, '/');
        if (slash) {
            snprintf(path, sizeof path, "%s/%.*s", dir, (int)(slash - name), name);
            struct stat parent;
            if (mkdir(path, 0700) != 0 &&
                (errno != EEXIST || stat(path, &parent) != 0 || !S_ISDIR(parent.st_mode)))
                return -1; /* "x" then "x/y": x is a file, the pack is rejected */
        }
        snprintf(path, sizeof path, "%s/%s", dir, name);
        struct stat st;
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return -1; /* "x" then "x/y" */
        fz_write_file(path, d + at, len);
        at += len;
        if (!files) memcpy(first, name, nl + 1);
        files++;
    }
    return files;
}

/* ---- JSON documents must be JSON ---- */

/* Repeated keys are legal JSON (RFC 8259 says names SHOULD be unique; jq and Python keep the
 * last) that strict readers refuse. They are findings where ckptfs chooses the keys (sidecars,
 * summary, HF headers and index) and tolerated where a document re-emits a map of the input
 * (metadata.json: CBOR maps, pickle dicts, GGUF arrays) or where the harness says so
 * (fz_json_lenient). Set CKPTFS_FUZZ_STRICT_JSON=1 to make those findings too. Nesting beyond
 * core/util/json.c's 128 levels is JSON all the same, so it is never a finding here. */
static bool fz_json_lenient;

static inline bool fz_strict_json(void) {
    static int strict = -1;
    if (strict < 0) strict = getenv("CKPTFS_FUZZ_STRICT_JSON") != NULL;
    return strict;
}

static inline void fz_check_json_doc(const char *what, const char *s, size_t len, bool input_keys) {
    json_doc doc;
    json_error e;
    if (json_parse(&doc, s, len, &e) == 0) {
        json_doc_free(&doc);
        return;
    }
    bool lenient = (fz_json_lenient || input_keys) && !fz_strict_json();
    if (strstr(e.msg, "nesting depth") || (lenient && strstr(e.msg, "duplicate key"))) return;
    fz_die("%s is not valid JSON: %s at byte %zu of %zu:\n%.*s", what, e.msg, e.pos, len,
           (int)(len > 6000 ? 6000 : len), s);
}

static inline void fz_check_json(const char *what, const char *s, size_t len) {
    fz_check_json_doc(what, s, len, false);
}

/* ---- reading through the planner ---- */

typedef size_t (*fz_plan_fn)(const void *obj, uint64_t off, uint64_t len, ckpt_segment *seg,
                             size_t cap, uint64_t *done);

static inline size_t fz_plan_tensor(const void *obj, uint64_t off, uint64_t len, ckpt_segment *seg,
                                    size_t cap, uint64_t *done) {
    return ckpt_plan(obj, off, len, seg, cap, done);
}

static inline size_t fz_plan_vfile(const void *obj, uint64_t off, uint64_t len, ckpt_segment *seg,
                                   size_t cap, uint64_t *done) {
    return ckpt_vfile_plan(obj, off, len, seg, cap, done);
}

static uint8_t fz_buf[FZ_CHUNK];
static uint64_t fz_budget;

/* Reads [off, off+len) of an object of `size` bytes as the FUSE read path does; copies the bytes
 * to out (may be NULL). Every segment must be inside its file; holes only where allowed. */
static inline void fz_read_range(const ckpt_catalog *cat, fz_plan_fn plan, const void *obj,
                                 const char *what, uint64_t size, uint64_t off, uint64_t len,
                                 bool holes_ok, uint8_t *out) {
    FZ_CHECK(off <= size && len <= size - off, "%s: bad range", what);
    while (len > 0) {
        uint64_t want = len < FZ_CHUNK ? len : FZ_CHUNK;
        ckpt_segment seg[FZ_SEGS];
        uint64_t done = 0;
        size_t n = plan(obj, off, want, seg, FZ_SEGS, &done);
        FZ_CHECK(n > 0 && done > 0 && done <= want,
                 "%s: plan of [%llu, +%llu) of %llu bytes made %zu segments covering %llu", what,
                 (unsigned long long)off, (unsigned long long)want, (unsigned long long)size, n,
                 (unsigned long long)done);
        uint64_t sum = 0;
        for (size_t i = 0; i < n; i++) {
            const ckpt_segment *s = &seg[i];
            FZ_CHECK(s->length > 0 && s->length <= done - sum, "%s: segment %zu length %llu", what,
                     i, (unsigned long long)s->length);
            switch (s->kind) {
            case CKPT_SEG_FILE: {
                FZ_CHECK(s->source < cat->nsources, "%s: segment source %u of %u", what, s->source,
                         cat->nsources);
                const ckpt_source *src = &cat->sources[s->source];
                FZ_CHECK(s->offset <= src->size && s->length <= src->size - s->offset,
                         "%s: segment [%llu, +%llu) outside %s (%llu bytes)", what,
                         (unsigned long long)s->offset, (unsigned long long)s->length, src->path,
                         (unsigned long long)src->size);
                ssize_t r = ckpt_source_pread(src, fz_buf + sum, s->length, s->offset);
                /* A damaged .zst frame is found when read: an error, never other bytes. */
                FZ_CHECK(r == (ssize_t)s->length || (src->zst && r < 0 && r != -EFAULT),
                         "%s: short read of %s", what, src->path);
                break;
            }
            case CKPT_SEG_MEM:
                FZ_CHECK(s->mem != NULL, "%s: memory segment without memory", what);
                memcpy(fz_buf + sum, s->mem, s->length);
                break;
            case CKPT_SEG_HOLE:
                FZ_CHECK(holes_ok, "%s: hole at byte %llu of a complete object", what,
                         (unsigned long long)(off + sum));
                memset(fz_buf + sum, 0, s->length);
                break;
            case CKPT_SEG_STRIDED: {
                /* A strided piece's run (a torch view saved transposed): read in blocks by the
                 * library, which checks every file offset against the source. */
                FZ_CHECK(s->source < cat->nsources, "%s: strided segment source %u of %u", what,
                         s->source, cat->nsources);
                int e = ckpt_read_segments(cat, s, 1, (char *)fz_buf + sum, NULL);
                FZ_CHECK(e == 0, "%s: strided read gave %d", what, e);
                break;
            }
            default:
                fz_die("%s: segment kind %u", what, s->kind);
            }
            sum += s->length;
        }
        FZ_CHECK(sum == done, "%s: segments cover %llu bytes, plan says %llu", what,
                 (unsigned long long)sum, (unsigned long long)done);
        if (out) memcpy(out, fz_buf, done), out += done;
        fz_budget = fz_budget > done ? fz_budget - done : 0;
        off += done;
        len -= done;
    }
    /* Past the end: nothing. */
    ckpt_segment seg[1];
    uint64_t done = 1;
    FZ_CHECK(plan(obj, size, 1, seg, 1, &done) == 0 && done == 0, "%s: plan past the end", what);
}

/* All of an object when the budget allows, else its head, middle and tail. */
static inline void fz_read_object(const ckpt_catalog *cat, fz_plan_fn plan, const void *obj,
                                  const char *what, uint64_t size, bool holes_ok) {
    if (size <= fz_budget) {
        fz_read_range(cat, plan, obj, what, size, 0, size, holes_ok, NULL);
        return;
    }
    uint64_t piece = 16384;
    if (size <= 3 * piece) piece = size / 3;
    fz_read_range(cat, plan, obj, what, size, 0, piece, holes_ok, NULL);
    fz_read_range(cat, plan, obj, what, size, size / 2, piece, holes_ok, NULL);
    fz_read_range(cat, plan, obj, what, size, size - piece, piece, holes_ok, NULL);
}

/* ---- tree paths: every raw file and sidecar has its own path, none is also a directory ---- */

/* CKPTFS_FUZZ_IGNORE="name_max": skip a check whose finding is already reported, so that an
 * exploratory run can look for other ones (never set in CI). */
static inline bool fz_ignored(const char *check) {
    const char *v = getenv("CKPTFS_FUZZ_IGNORE");
    return v && strstr(v, check);
}

static inline int fz_strcmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static inline void fz_check_paths(const ckpt_catalog *cat) {
    size_t n = cat->ntensors * 2, ndirs = 0;
    if (!n) return;
    char **files = malloc(n * sizeof *files);
    char **sides = calloc(cat->ntensors, sizeof *sides); /* ours to free: files gets sorted */
    size_t dcap = 16;
    char **dirs = malloc(dcap * sizeof *dirs);
    FZ_CHECK(files && sides && dirs, "out of memory");
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        FZ_CHECK(t->path && t->path[0] && t->path[0] != '/', "tensor %zu: bad path", i);
        files[2 * i] = (char *)t->path;
        files[2 * i + 1] = sides[i] = ckpt_sidecar_path(t);
        FZ_CHECK(files[2 * i + 1], "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        const char *p = files[i];
        FZ_CHECK(!strstr(p, "//") && p[strlen(p) - 1] != '/', "path \"%s\" has an empty part", p);
        for (const char *s = strchr(p, '/'); s; s = strchr(s + 1, '/')) {
            if (ndirs == dcap) {
                dcap *= 2;
                dirs = realloc(dirs, dcap * sizeof *dirs);
                FZ_CHECK(dirs, "out of memory");
            }
            dirs[ndirs] = strndup(p, (size_t)(s - p));
            FZ_CHECK(dirs[ndirs], "out of memory");
            ndirs++;
        }
        /* Each component: a name a directory may hold. */
        const char *c = p;
        for (;;) {
            const char *e = strchr(c, '/');
            size_t len = e ? (size_t)(e - c) : strlen(c);
            FZ_CHECK(len > 0 && (len <= 255 || fz_ignored("name_max")) &&
                         !(len == 1 && c[0] == '.') && !(len == 2 && c[0] == '.' && c[1] == '.'),
                     "path \"%s\": component of %zu bytes", p, len);
            for (size_t k = 0; k < len; k++)
                FZ_CHECK((unsigned char)c[k] >= 0x20 && c[k] != 0x7f, "path \"%s\": control byte",
                         p);
            if (!e) break;
            c = e + 1;
        }
    }
    qsort(files, n, sizeof *files, fz_strcmp);
    for (size_t i = 1; i < n; i++)
        FZ_CHECK(strcmp(files[i - 1], files[i]) != 0, "two files at path \"%s\"", files[i]);
    if (ndirs) {
        qsort(dirs, ndirs, sizeof *dirs, fz_strcmp);
        for (size_t i = 0; i < n; i++)
            FZ_CHECK(!bsearch(&files[i], dirs, ndirs, sizeof *dirs, fz_strcmp),
                     "\"%s\" is both a file and a directory", files[i]);
    }
    for (size_t i = 0; i < ndirs; i++) free(dirs[i]);
    for (size_t i = 0; i < cat->ntensors; i++) free(sides[i]);
    free(sides);
    free(dirs);
    free(files);
}

/* ---- the HF view ---- */

static inline uint64_t fz_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* Reads a view file's synthesized part and checks it is what a safetensors reader accepts:
 * u64 header length, a JSON object, data offsets tiling the data section (JSON files: valid
 * JSON). */
static inline void fz_check_view_file(const ckpt_catalog *cat, const ckpt_hfview_file *f) {
    const ckpt_vfile *vf = &f->vf;
    char what[96];
    snprintf(what, sizeof what, "hf view %s", f->name);
    /* The index, and a synthesized config.json (Meta checkpoints): JSON documents. */
    if (strstr(f->name, ".index.json") || strcmp(f->name, "config.json") == 0) {
        FZ_CHECK(vf->size < (64u << 20), "%s: %llu bytes", what, (unsigned long long)vf->size);
        uint8_t *text = malloc(vf->size ? vf->size : 1);
        FZ_CHECK(text, "out of memory");
        fz_read_range(cat, fz_plan_vfile, vf, what, vf->size, 0, vf->size, false, text);
        fz_check_json(what, (const char *)text, vf->size);
        free(text);
        return;
    }
    FZ_CHECK(vf->size >= 8, "%s: %llu bytes", what, (unsigned long long)vf->size);
    uint8_t len8[8];
    fz_read_range(cat, fz_plan_vfile, vf, what, vf->size, 0, 8, false, len8);
    uint64_t hlen = fz_le64(len8);
    FZ_CHECK(hlen <= vf->size - 8 && hlen % 8 == 0 && hlen < (64u << 20),
             "%s: header length %llu of %llu", what, (unsigned long long)hlen,
             (unsigned long long)vf->size);
    char *hdr = malloc(hlen ? hlen : 1);
    FZ_CHECK(hdr, "out of memory");
    fz_read_range(cat, fz_plan_vfile, vf, what, vf->size, 8, hlen, false, (uint8_t *)hdr);
    json_doc doc;
    json_error e;
    if (json_parse(&doc, hdr, hlen, &e) != 0)
        fz_die("%s: header is not valid JSON: %s at %zu:\n%.*s", what, e.msg, e.pos,
               (int)(hlen > 6000 ? 6000 : hlen), hdr);
    FZ_CHECK(doc.root->type == JSON_OBJECT, "%s: header is not an object", what);
    uint64_t at = 0, data = vf->size - 8 - hlen;
    for (const json_value *m = doc.root->head; m; m = m->next) {
        if (m->key_len == 12 && !memcmp(m->key, "__metadata__", 12)) continue;
        const json_value *o = json_member(m, "data_offsets");
        uint64_t a, b;
        FZ_CHECK(o && o->type == JSON_ARRAY && o->count == 2 && json_as_u64(o->head, &a) &&
                     json_as_u64(o->head->next, &b),
                 "%s: \"%.*s\" has no data_offsets", what, (int)m->key_len, m->key);
        FZ_CHECK(a == at && b >= a && b <= data, "%s: \"%.*s\" data_offsets [%llu, %llu), %llu",
                 what, (int)m->key_len, m->key, (unsigned long long)a, (unsigned long long)b,
                 (unsigned long long)at);
        at = b;
    }
    FZ_CHECK(at == data, "%s: tensors cover %llu of %llu data bytes", what, (unsigned long long)at,
             (unsigned long long)data);
    json_doc_free(&doc);
    free(hdr);
    fz_read_object(cat, fz_plan_vfile, vf, what, vf->size, false);
}

static inline void fz_check_view(const ckpt_catalog *cat, uint64_t max_shard) {
    ckpt_hfview v;
    ckpt_err err;
    int rc = ckpt_hfview_build(cat, max_shard, &v, &err);
    if (rc == -ENOMEM) return;
    FZ_CHECK(rc == 0, "hf view refused a finished catalog: %s", err.msg);
    for (size_t i = 0; i < v.nfiles; i++) fz_check_view_file(cat, &v.files[i]);
    ckpt_hfview_free(&v);
}

/* ---- everything the mount would show ---- */

static inline void fz_exercise(const ckpt_catalog *cat, uint64_t max_shard) {
    fz_budget = FZ_READ_BUDGET;
    size_t len;
    char *s;
    if ((s = ckpt_summary_json(cat, &len))) fz_check_json("summary.json", s, len), free(s);
    if ((s = ckpt_metadata_json(cat, &len)))
        fz_check_json_doc("metadata.json", s, len, true), free(s);
    if ((s = ckpt_tensors_tsv(cat, &len))) {
        size_t lines = 0;
        for (size_t i = 0; i < len; i++) lines += s[i] == '\n';
        FZ_CHECK(lines == cat->ntensors + 1, "tensors.tsv: %zu lines for %zu tensors", lines,
                 cat->ntensors);
        free(s);
    }
    fz_check_paths(cat);
    for (size_t i = 0; i < cat->ntensors; i++) {
        const ckpt_tensor *t = &cat->tensors[i];
        char what[64];
        snprintf(what, sizeof what, "tensor %zu (%s)", i, ckpt_dtype_info_of(t->dtype)->name);
        uint64_t numel, nbytes;
        FZ_CHECK(catalog_shape_nbytes(t->shape, t->ndim, t->dtype, &numel, &nbytes) &&
                     numel == t->numel && nbytes == t->nbytes,
                 "%s: numel/nbytes disagree with the shape", what);
        if ((s = ckpt_sidecar_json(cat, t, &len))) fz_check_json(what, s, len), free(s);
        if ((s = ckpt_npy_header(t, &len))) {
            FZ_CHECK(len >= 10 && len % 64 == 0 && !memcmp(s, "\x93NUMPY", 6) && s[len - 1] == '\n',
                     "%s: npy header of %zu bytes", what, len);
            free(s);
        }
        if (t->nbytes) FZ_CHECK(t->npieces > 0 || t->incomplete, "%s: no bytes anywhere", what);
        fz_read_object(cat, fz_plan_tensor, t, what, t->nbytes, t->incomplete);
    }
    for (size_t i = 0; i < cat->naux; i++)
        FZ_CHECK(cat->aux[i].source < cat->nsources, "aux file %zu: source %u", i,
                 cat->aux[i].source);
    fz_check_view(cat, max_shard);
}

/* A max_shard_size for the view from the input: the default, or small enough to split. */
static inline uint64_t fz_shard_size_of(const uint8_t *d, size_t n) {
    static const uint64_t sizes[] = {CKPT_HF_MAX_SHARD_DEFAULT, 0, 1, 4096};
    return sizes[n ? d[n - 1] % 4 : 0];
}

/* Opens path like the mount does and exercises what it shows. */
static inline void fz_open_and_exercise(const char *path, const uint8_t *d, size_t n) {
    ckpt_catalog *cat;
    ckpt_err err;
    err.msg[0] = '\0';
    int rc = ckpt_open(path, NULL, &cat, &err);
    if (rc) {
        FZ_CHECK(rc < 0 && err.msg[0], "ckpt_open failed (%d) without a message", rc);
        FZ_CHECK(strlen(err.msg) < sizeof err.msg, "unterminated message");
        return;
    }
    fz_exercise(cat, fz_shard_size_of(d, n));
    ckpt_close(cat);
}

/* Single-file harness: raw bytes -> dir/default_name, or a pack whose first file is opened.
 * probe: the decoder's probe; inputs it refuses are rejected (-1) so the corpus stays on-format.
 */
static inline int fz_file_harness(const uint8_t *d, size_t n, const char *default_name,
                                  const ckpt_format *fmt) {
    const char *dir = fz_fresh_dir();
    char name[FZ_MAX_NAME + 1], path[512];
    const uint8_t *head = d;
    size_t head_n = n;
    uint64_t file_size = n;
    if (fz_is_pack(d, n)) {
        if (fz_unpack(dir, d, n, name) <= 0) return -1;
        snprintf(path, sizeof path, "%s/%s", dir, name);
        head = NULL;
    } else {
        snprintf(path, sizeof path, "%s/%s", dir, default_name);
        fz_write_file(path, d, n);
    }
    if (fmt) {
        unsigned char buf[PROBE_BYTES];
        if (!head) {
            int fd = open(path, O_RDONLY);
            if (fd < 0) return -1;
            ssize_t r = read(fd, buf, sizeof buf);
            struct stat st;
            int s = fstat(fd, &st);
            close(fd);
            if (r < 0 || s != 0) return -1;
            head = buf;
            head_n = (size_t)r;
            file_size = (uint64_t)st.st_size;
        }
        if (!fmt->probe(head, head_n < PROBE_BYTES ? head_n : PROBE_BYTES, file_size)) return -1;
    }
    fz_open_and_exercise(path, d, n);
    return 0;
}

/* Directory harness: a pack becomes the directory that is opened. */
static inline int fz_dir_harness(const uint8_t *d, size_t n, bool (*probe)(const char *dir)) {
    if (!fz_is_pack(d, n)) return -1;
    const char *dir = fz_fresh_dir();
    char first[FZ_MAX_NAME + 1];
    if (fz_unpack(dir, d, n, first) <= 0) return -1;
    if (probe && !probe(dir)) return -1;
    fz_open_and_exercise(dir, d, n);
    return 0;
}

#endif
