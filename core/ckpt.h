/* libckpt: decodes checkpoint formats into one model — named tensors whose bytes live at known
 * extents of known files — and plans reads of any byte range of any tensor. No FUSE here. */
#ifndef CKPT_H
#define CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

/* The library's version ("0.1.0"), from the source tree's VERSION file. */
const char *ckpt_version(void);

/* ---- errors: functions return 0 or a negative errno and fill a one-line message ---- */

typedef struct ckpt_err {
    char msg[512];
} ckpt_err;

int ckpt_fail(ckpt_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- element types ---- */

typedef enum {
    /* safetensors dtypes */
    CKPT_BOOL,
    CKPT_U8,
    CKPT_I8,
    CKPT_U16,
    CKPT_I16,
    CKPT_F16,
    CKPT_BF16,
    CKPT_U32,
    CKPT_I32,
    CKPT_F32,
    CKPT_U64,
    CKPT_I64,
    CKPT_F64,
    CKPT_C64,
    CKPT_F8_E4M3,
    CKPT_F8_E5M2,
    CKPT_F8_E8M0,
    CKPT_F8_E4M3FNUZ,
    CKPT_F8_E5M2FNUZ,
    CKPT_F4,
    CKPT_F6_E2M3,
    CKPT_F6_E3M2,
    /* beyond safetensors: torch complex128 */
    CKPT_C128,
    /* ggml block-quantized types: opaque blocks of `block` elements */
    CKPT_Q4_0,
    CKPT_Q4_1,
    CKPT_Q5_0,
    CKPT_Q5_1,
    CKPT_Q8_0,
    CKPT_Q8_1,
    CKPT_Q2_K,
    CKPT_Q3_K,
    CKPT_Q4_K,
    CKPT_Q5_K,
    CKPT_Q6_K,
    CKPT_Q8_K,
    CKPT_IQ2_XXS,
    CKPT_IQ2_XS,
    CKPT_IQ3_XXS,
    CKPT_IQ1_S,
    CKPT_IQ4_NL,
    CKPT_IQ3_S,
    CKPT_IQ2_S,
    CKPT_IQ4_XS,
    CKPT_IQ1_M,
    CKPT_TQ1_0,
    CKPT_TQ2_0,
    CKPT_MXFP4,
    CKPT_NVFP4,
    CKPT_Q1_0,
    CKPT_Q2_0,
    CKPT_DTYPE_COUNT
} ckpt_dtype;

/* Sizes are per block: `block` elements take `block_bytes` bytes. Plain types have block 1;
 * F4 is 2 elements per byte, F6 4 elements per 3 bytes, ggml Q4_0 32 elements per 18 bytes. */
typedef struct ckpt_dtype_info {
    const char *name; /* safetensors spelling, or the ggml type name */
    unsigned block;   /* elements per block */
    unsigned block_bytes;
    const char *numpy; /* numpy dtype string, NULL when numpy has none */
    bool safetensors;  /* a dtype safetensors files may use */
} ckpt_dtype_info;

const ckpt_dtype_info *ckpt_dtype_info_of(ckpt_dtype dt);
/* Exact, case-sensitive match of a dtype name. */
bool ckpt_dtype_parse(const char *s, size_t len, ckpt_dtype *out);
/* Bytes per element for plain types (block 1), 0 for packed and block types. */
unsigned ckpt_dtype_elem_size(ckpt_dtype dt);

/* ---- catalog ---- */

enum { CKPT_MAX_DIMS = 32 };

/* What a virtual source does (see ckpt_source.virt). pread reads as a file's does (a short
 * count is not the end, 0 is) and is safe from many threads; last_error says why the calling
 * thread's last pread failed; release frees ctx with the catalog. */
typedef struct ckpt_virtual_ops {
    ssize_t (*pread)(void *ctx, void *buf, size_t len, uint64_t off);
    const char *(*last_error)(void);
    void (*release)(void *ctx);
} ckpt_virtual_ops;

typedef struct ckpt_source {
    char *path;    /* as opened */
    char *relpath; /* relative to the catalog root, shown in sidecars */
    int fd;        /* -1: opened for each read (a catalog of more files than fds allow) */
    uint64_t size;
    struct timespec mtime;
    /* The inode's change time at open: a rewrite whose mtime was put back (`cp -p`, `touch -r`,
     * `rsync --inplace -t`) still moves it. So do chmod, chown, ln and rm of the file. */
    struct timespec ctime;
    /* The link count that goes with ctime: a link or unlink of the file (a commit linking an
     * unchanged shard into its output) moves ctime and the count but no byte, so a ctime that
     * moved together with the count is taken as the file's, with the count (ckptfs(1) NOTES). */
    uint64_t nlink;
    mode_t mode;
    dev_t dev;
    ino_t ino;
    struct zst_table *zst; /* a seekable zstd file: size and reads are its decompressed content */
    /* A member of a tar archive: path is the archive, relpath the member's name in it, and the
     * content is the `size` bytes at `base` of the archive (file_size bytes on disk). */
    const char *member_of; /* the archive's relpath, or NULL for a file of its own */
    uint64_t base;
    uint64_t file_size;
    struct remote_object *remote; /* an object behind a URL (fd is -1): read via the block cache */
    /* A file its reader writes itself (a stage's spool, whose pack grows during a commit): its
     * size and mtime are not pinned, only its identity (device, inode) is checked. */
    bool owned;
    /* Bytes made when read, stored in no file (fd is -1): convert --dtype's cast tensors. */
    const struct ckpt_virtual_ops *virt;
    void *virt_ctx;
    /* Set (atomically) once a check after bytes went out found the source changed: it stays
     * changed, so every later read fails even if the check itself would now pass. */
    bool seen_changed;
    /* Odd (atomically) while the catalog's owner links or unlinks the file itself (a stage's
     * commit): ctime moves then without a write, so only size and mtime are compared until
     * ckpt_source_own_ctime_end takes the new ctime as the file's and makes it even again. A
     * reader that sees it change while it looks at ctime takes the change for that one. */
    unsigned own_ctime_gen;
} ckpt_source;

/* Up to len bytes of the source's content at off (decompressed for a .zst source): the number
 * read (0 at the end), or a negative errno. Safe to call from many threads at once. */
ssize_t ckpt_source_pread(const ckpt_source *s, void *buf, size_t len, uint64_t off);
/* A remote source's bytes where its block cache holds them, without copying them out: what a
 * reply that writes them straight from there needs. Up to CKPT_VIEW_MAX pieces. */
enum { CKPT_VIEW_MAX = 4 };
typedef struct ckpt_view {
    size_t n;
    const void *base[CKPT_VIEW_MAX];
    size_t len[CKPT_VIEW_MAX];
    void *hold[CKPT_VIEW_MAX];
} ckpt_view;
/* Appends [off, off+len) of s (len bytes, all inside it) to v. 1 when appended, 0 when these
 * bytes cannot be viewed (a local or .zst source, more pieces than fit: read them instead),
 * or a negative errno as ckpt_source_pread's. Safe from many threads. */
int ckpt_source_view(const ckpt_source *s, uint64_t off, size_t len, ckpt_view *v);
/* Lets the cache drop what v pointed at; v is empty again. */
void ckpt_view_release(ckpt_view *v);
/* A new descriptor of the source's file, checked to be the file the catalog saw (device,
 * inode, size, mtime, ctime: a file rewritten in place is another file): >= 0, or a negative
 * errno (-EIO for another file). */
int ckpt_source_open_again(const ckpt_source *s);
/* A remote source whose object was seen changed (other ETag or size) since it was pinned:
 * reads give EIO, like a local file modified under the mount. False for local sources. */
bool ckpt_source_remote_changed(const ckpt_source *s);
/* Cache and request counters of the remote sources as a JSON object (malloc'd). */
char *ckpt_remote_stats_json(size_t *len);
/* True for names ckpt_open takes as URLs (http://, https://, s3://, hf://). */
bool ckpt_is_url(const char *path);
/* A source's name as every message, page, listing and mount table shows it: a URL without its
 * user:password@ and ?query (where passwords and signatures live), any other name unchanged.
 * The one scrubbing path: everything that prints a source name goes through it. */
void ckpt_shown_name(const char *path, char *out, size_t cap);
/* Whether the file behind the source's descriptor still has the size, modification time and
 * change time it had when opened. A file rewritten in place (`cp NEW SRC`: same inode) changes
 * its mtime and ctime, and ctime cannot be put back from user space, so readers check after
 * reading: bytes read before the check that passes are the old ones (the kernel updates both
 * times before it copies a write's data into the page cache). One fstat. False forever once
 * ckpt_source_mark_changed was called. */
bool ckpt_source_unchanged(const ckpt_source *s);
struct stat;
/* Whether st (an fstat or stat of the source's file) shows the size and times recorded at open.
 * A ctime that moved while the link count changed is recorded as the file's (a link, not a
 * write); a ctime that moved with the same count (`cp -p`, chmod) is a change. */
bool ckpt_source_stat_matches(const ckpt_source *s, const struct stat *st);
/* Whether the file at the source's path is still the one the catalog read: the same device,
 * inode, size, modification and change time (ckpt_source_stat_matches on a stat of the path),
 * and ckpt_source_unchanged. A descriptor keeps the old file readable after it was replaced or
 * removed, which ckpt_source_unchanged alone cannot see: what an open of a file checks. Remote
 * and virtual sources have no path to look at: ckpt_source_unchanged. */
bool ckpt_source_current(const ckpt_source *s);
/* Whether the source's path still names the file the catalog opened (device and inode), however
 * it changed in place (reads see that): false for a file replaced under its name or removed.
 * True for remote and virtual sources, which have no path (a changed object fails its reads). */
bool ckpt_source_same_file(const ckpt_source *s);
/* Records that bytes already sent may not be the source's (a check after a spliced reply
 * failed): every later ckpt_source_unchanged is false. True for the call that marked it first
 * (the one to tell the user). Safe from many threads. */
bool ckpt_source_mark_changed(const ckpt_source *s);
/* A caller about to link, rename or unlink the source's file itself brackets that with these:
 * in between, a ctime that moved is not taken as a change; at the end the present ctime is
 * recorded if size and mtime are still the recorded ones (else the source reads as changed). */
void ckpt_source_own_ctime_begin(ckpt_source *s);
void ckpt_source_own_ctime_end(ckpt_source *s);
/* Bytes the source takes on disk: its size, the compressed size of a .zst, or a tar member's
 * size in the archive. */
uint64_t ckpt_source_stored_size(const ckpt_source *s);
/* Where [off, off+len) of the source's content lie as they are in its file: true with *file_off
 * set for a local file and a member of a local tar (the member's offset in its archive added),
 * false for a .zst, a remote object and bytes made when read, and for a range past the end.
 * Such bytes may go to the kernel by splice or copy_file_range from the source's descriptor
 * (fd, or one from ckpt_source_open_again). */
bool ckpt_source_file_extent(const ckpt_source *s, uint64_t off, uint64_t len, uint64_t *file_off);
/* Whether the source is a whole local file as it is: its content offsets are the file's, and the
 * file may be linked or cloned (not a .zst, a tar member, a remote object or made bytes). */
bool ckpt_source_whole_file(const ckpt_source *s);
/* ckpt_source_whole_file, and that file is the one of device dev and inode ino. */
bool ckpt_source_is_file(const ckpt_source *s, dev_t dev, ino_t ino);

/* A box of the full tensor whose bytes live in one file. Offsets, sizes and strides are in
 * elements; strides NULL means row-major contiguous over sizes. */
typedef struct ckpt_piece {
    uint32_t source;
    uint64_t file_offset;
    uint64_t *offsets;
    uint64_t *sizes;
    uint64_t *strides;
} ckpt_piece;

typedef struct ckpt_piece_index ckpt_piece_index;

/* A tensor's format-specific sidecar members, kept in whatever form is cheapest and rendered as
 * `"k": v, ...` text when a sidecar is read (ckpt_tensor_extra). Text set by catalog_set_extra
 * is one kind; a format whose members repeat across tensors (torch: the other users of a shared
 * storage) keeps a small record per tensor and the shared parts once. A kind's record starts
 * with this header. */
typedef struct ckpt_extra ckpt_extra;
typedef struct ckpt_tensor ckpt_tensor;
struct strbuf;
typedef struct ckpt_extra_kind {
    /* Appends the members of x, the extras of tensor t; sets sb's failed flag on ENOMEM. */
    void (*render)(const ckpt_extra *x, const ckpt_tensor *t, struct strbuf *sb);
} ckpt_extra_kind;
struct ckpt_extra {
    const ckpt_extra_kind *kind;
};

/* Fields ordered so that the flags share one word with npieces: 96 bytes, for a catalog of a
 * million tensors holds a million of them. */
struct ckpt_tensor {
    const char *name; /* may contain NUL bytes: always use name_len */
    size_t name_len;
    ckpt_dtype dtype;
    uint32_t ndim;
    uint64_t *shape;
    uint64_t numel;
    uint64_t nbytes;
    ckpt_piece *pieces;
    ckpt_piece_index *index; /* built by ckpt_catalog_finish for multi-piece tensors */
    const ckpt_extra *extra; /* format-specific sidecar members, or NULL */
    const char *prefix;      /* NULL, or a directory the tensor is shown under ("optim/",
                                ".ckptfs/ranks/1/"), put in front of its path as it is */
    const char *path;        /* where the mount shows the raw bytes (see treepath.c); its
                                .json sidecar: ckpt_sidecar_path */
    uint32_t npieces;
    bool path_raw;   /* path ends in ".raw": it is also a directory (not in the sidecar's) */
    bool incomplete; /* some elements are covered by no piece */
    bool aside;      /* not part of the model (per-rank copies, optimizer state):
                        left out of the HF view and the model's totals */
    bool hf_view;    /* an aside tensor the HF view shows instead of the model's
                        own (a Meta checkpoint's Llama-named, rotary-permuted
                        weights): when any tensor has it, the view has only those */
};

/* A named JSON document that goes into .ckptfs/metadata.json under `key`. */
typedef struct ckpt_doc {
    const char *key;
    const char *json;
    size_t len;
} ckpt_doc;

/* A source file shown as-is (config.json, tokenizer files). */
typedef struct ckpt_aux_file {
    const char *name;
    uint32_t source;
} ckpt_aux_file;

/* Remote sources (http://, https://, s3://, hf://): cache and connection settings. Zero or NULL
 * fields take the defaults documented in ckptfs(1). */
typedef struct ckpt_remote_options {
    const char *s3_endpoint;   /* else AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, AWS */
    const char *s3_region;     /* else AWS_REGION, AWS_DEFAULT_REGION, us-east-1 */
    const char *s3_addressing; /* "path" or "virtual" (default: path for a custom endpoint) */
    const char *cache_dir;     /* on-disk block cache, kept across mounts */
    uint64_t cache_size;       /* bytes kept in cache_dir */
    uint64_t cache_ram;        /* bytes of blocks kept in memory */
    uint64_t block_size;       /* bytes per cached block */
    unsigned prefetch;         /* blocks fetched ahead of a sequential reader (in flight) */
    unsigned timeout;          /* seconds without progress before a request is retried */
    unsigned retries;          /* retries of timeouts, resets and 5xx */
    bool prefetch_set;         /* prefetch=0 was given (no prefetch) */
    bool retries_set;          /* retries=0 was given (no retries) */
} ckpt_remote_options;

/* What the user can say about decoding (mount -o options). */
typedef struct ckpt_options {
    /* Tensor-parallel split dimensions, "GLOB:DIM[,GLOB:DIM...]" (fnmatch on tensor names). */
    const char *tp_split;
    /* Hugging Face cache repo folder: the ref or commit whose snapshot is mounted (NULL: main). */
    const char *revision;
    ckpt_remote_options remote;
} ckpt_options;

typedef struct ckpt_catalog ckpt_catalog;

struct ckpt_catalog {
    const char *format; /* "safetensors", "hf-safetensors", ... */
    char *root;         /* the path the catalog was opened from */
    ckpt_source *sources;
    uint32_t nsources;
    ckpt_tensor *tensors;
    size_t ntensors;
    ckpt_doc *docs;
    size_t ndocs;
    ckpt_aux_file *aux;
    size_t naux;
    char **warnings;
    size_t nwarnings;
    /* Members `"k": v, ...` that summary.json shows after "format" (which weights were chosen
     * over which, the checkpoints of a folder), or NULL. */
    const char *summary_extra;
    /* A config.json the HF view synthesizes (from a Meta params.json), or NULL. */
    const char *hf_config;
    ckpt_options opts;
    struct ckpt_catalog_private *priv;
};

/* Opens a checkpoint file or directory, chosen by content. opts may be NULL. */
int ckpt_open(const char *path, const ckpt_options *opts, ckpt_catalog **out, ckpt_err *err);
void ckpt_close(ckpt_catalog *cat);
/* What the format's own checks at open covered ("structure, and the CRC-32 of ..."): verify
 * reports it. */
const char *ckpt_format_checks(const ckpt_catalog *cat);
/* Exactly len bytes of source `source` at off, or an error naming the file, what was read
 * (`what`) and where. */
int ckpt_source_read(const ckpt_catalog *cat, uint32_t source, uint64_t off, void *buf, size_t len,
                     const char *what, ckpt_err *err);

/* ---- the catalog through functions, for callers that cannot see these structs (a Python
 * ctypes or another language's FFI): each gives what the struct's field holds, so that such a
 * caller needs no copy of the layouts above. ---- */

size_t ckpt_tensor_count(const ckpt_catalog *cat);
/* The i-th tensor (the order ckptfs ls lists), or NULL when i >= ckpt_tensor_count(cat). */
const ckpt_tensor *ckpt_tensor_at(const ckpt_catalog *cat, size_t i);
/* The tensor with this NUL-terminated name, or NULL; a walk over the catalog (O(tensors)). */
const ckpt_tensor *ckpt_tensor_find(const ckpt_catalog *cat, const char *name);
/* Its name (NUL-terminated; it may hold NUL bytes too: *len, when len is not NULL, is its
 * length). */
const char *ckpt_tensor_name(const ckpt_tensor *t, size_t *len);
/* The dtype's name as ckpt_dtype_info_of gives it ("BF16", "Q4_K"). */
const char *ckpt_tensor_dtype(const ckpt_tensor *t);
uint32_t ckpt_tensor_ndim(const ckpt_tensor *t);
/* Size of dimension i, 0 when i >= ndim. */
uint64_t ckpt_tensor_dim(const ckpt_tensor *t, uint32_t i);
/* Bytes of the tensor's consolidated, row-major data. */
uint64_t ckpt_tensor_nbytes(const ckpt_tensor *t);
/* Exactly len bytes of the consolidated data at off into buf, whatever shards, pieces or
 * compressed frames hold them: 0, or a negative errno with err naming the tensor and range
 * (-EINVAL past the end, -EIO for bytes no file holds or a source that changed). */
int ckpt_tensor_read(const ckpt_catalog *cat, const ckpt_tensor *t, uint64_t off, void *buf,
                     size_t len, ckpt_err *err);

/* ---- byte ranges of a tensor -> file segments ---- */

/* CKPT_SEG_STRIDED: tensor bytes of one piece whose elements are not adjacent in its file (a
 * transposed view saved as is); read through ckpt_read_segments, which copies them in blocks
 * rather than one element at a time. */
enum { CKPT_SEG_FILE, CKPT_SEG_HOLE, CKPT_SEG_MEM, CKPT_SEG_STRIDED };

typedef struct ckpt_segment {
    uint32_t kind;
    uint32_t source; /* CKPT_SEG_FILE, CKPT_SEG_STRIDED */
    uint64_t offset; /* file offset (CKPT_SEG_FILE); tensor byte offset (CKPT_SEG_STRIDED) */
    const void *mem; /* CKPT_SEG_MEM; the ckpt_tensor (CKPT_SEG_STRIDED) */
    uint64_t length;
    uint32_t piece; /* CKPT_SEG_STRIDED: index into the tensor's pieces */
} ckpt_segment;

/* Maps [off, off+len) of the tensor's logical row-major bytes onto at most `cap` segments,
 * merging runs that are adjacent in the same file. Returns the number of segments; *done is
 * the number of bytes they cover (less than len when cap ran out: call again from off+*done). */
size_t ckpt_plan(const ckpt_tensor *t, uint64_t off, uint64_t len, ckpt_segment *seg, size_t cap,
                 uint64_t *done);

/* ---- virtual files: ordered parts, each a memory buffer or a tensor byte range ---- */

/* A part whose bytes are worked out when read (a header rendered a page at a time, the data of
 * many tensors found from a page index): plans [off, off+len) of the part like ckpt_plan. Memory
 * segments it gives stay valid until the calling thread plans again. */
typedef struct ckpt_vgen ckpt_vgen;
struct ckpt_vgen {
    size_t (*plan)(const ckpt_vgen *g, uint64_t off, uint64_t len, ckpt_segment *seg, size_t cap,
                   uint64_t *done);
};

typedef struct ckpt_vpart {
    uint64_t start; /* offset of this part in the virtual file */
    uint64_t length;
    const void *mem;           /* memory part when tensor == NULL, or its ckpt_vgen */
    const ckpt_tensor *tensor; /* tensor part: bytes [tensor_off, tensor_off+length) */
    uint64_t tensor_off;       /* when tensor == NULL: CKPT_VPART_GEN for a generated part */
} ckpt_vpart;
enum { CKPT_VPART_GEN = 1 };

typedef struct ckpt_vfile {
    ckpt_vpart *parts;
    size_t nparts;
    size_t cap;
    uint64_t size;
} ckpt_vfile;

/* Room for nparts parts in all, so that a file of a million parts is not grown by doubling. */
int ckpt_vfile_reserve(ckpt_vfile *vf, size_t nparts);
int ckpt_vfile_add_mem(ckpt_vfile *vf, const void *mem, uint64_t len);
int ckpt_vfile_add_tensor(ckpt_vfile *vf, const ckpt_tensor *t, uint64_t off, uint64_t len);
/* len bytes planned by g (which must outlive the file). */
int ckpt_vfile_add_gen(ckpt_vfile *vf, const ckpt_vgen *g, uint64_t len);
void ckpt_vfile_free(ckpt_vfile *vf);
/* Like ckpt_plan over the whole virtual file. */
size_t ckpt_vfile_plan(const ckpt_vfile *vf, uint64_t off, uint64_t len, ckpt_segment *seg,
                       size_t cap, uint64_t *done);

/* ---- writing (writer.h) ---- */

typedef struct ckpt_progress {
    void (*report)(void *ctx, uint64_t done, uint64_t total);
    void *ctx;
} ckpt_progress;

typedef struct ckpt_write_opts {
    uint64_t max_shard_size; /* safetensors: > 0 writes an HF directory with an index */
    bool replace_dir;        /* an HF directory OUT that exists is replaced (else: refused) */
    /* OUT is the very directory the catalog was opened from, and the caller opens it again
     * after the write (a stage --from OUT): its files may be replaced. Without it, a directory
     * OUT that holds a file of the catalog's sources is refused before anything is written. */
    bool replaces_own_source;
    ckpt_progress progress;
    /* Called with the finished, fsynced temporary file (or directory) just before it is
     * renamed into place as OUT; a negative errno stops the write there (OUT untouched). Why:
     * a stage --from OUT records what becomes OUT first, so that after a kill it still knows
     * the new OUT as its own commit. */
    int (*before_publish)(void *ctx, const char *tmp_path);
    void *publish_ctx;
} ckpt_write_opts;

/* ---- where the mount shows a tensor's sidecar: t->path without its ".raw", + ".json" ---- */

/* How many bytes of t->path the sidecar's path starts with (the rest is ".json"). Not stored:
 * at 300,000 tensors the sidecar paths took 10 MB. */
size_t ckpt_sidecar_stem(const ckpt_tensor *t);
/* Whether p (len bytes) is t's sidecar path. */
bool ckpt_is_sidecar_path(const ckpt_tensor *t, const char *p, size_t len);
/* t's sidecar path, malloc'd (NULL when out of memory). */
char *ckpt_sidecar_path(const ckpt_tensor *t);

/* ---- documents shown by the mount (malloc'd, NUL-terminated; NULL on ENOMEM) ---- */

char *ckpt_sidecar_json(const ckpt_catalog *cat, const ckpt_tensor *t, size_t *len);
/* Appends t's format-specific sidecar members (`"k": v, ...`, no braces); false when it has
 * none. sb's failed flag tells of ENOMEM. */
bool ckpt_tensor_extra(const ckpt_tensor *t, struct strbuf *sb);
/* The sidecar of the tensor as shown converted to F32 (-o as_dtype=f32) when as_f32. */
char *ckpt_sidecar_json_as(const ckpt_catalog *cat, const ckpt_tensor *t, bool as_f32, size_t *len);
/* Marks (is_alias[i], one per tensor) the model tensors whose bytes are the very stored extent
 * of an earlier one (tied weights: one source, offset and size); returns how many. */
size_t ckpt_mark_aliases(const ckpt_catalog *cat, bool *is_alias);
char *ckpt_summary_json(const ckpt_catalog *cat, size_t *len);
/* The same with the aliases already marked (ckpt_mark_aliases): marking them again takes 32
 * bytes a tensor for a moment, at a million tensors more than a mount's bound leaves. */
char *ckpt_summary_json_marked(const ckpt_catalog *cat, const bool *marked, size_t *len);
char *ckpt_metadata_json(const ckpt_catalog *cat, size_t *len);
char *ckpt_tensors_tsv(const ckpt_catalog *cat, size_t *len);
/* tensors.tsv without holding its text (28 bytes a tensor at the least): measured once, then
 * rendered a page of CKPT_TSV_PAGE lines at a time when read, byte for byte what
 * ckpt_tensors_tsv returns. Holds 8 bytes a page; cat must outlive it. */
enum { CKPT_TSV_PAGE = 256 };
typedef struct ckpt_tsv_pages ckpt_tsv_pages;
ckpt_tsv_pages *ckpt_tsv_pages_new(const ckpt_catalog *cat);
uint64_t ckpt_tsv_pages_size(const ckpt_tsv_pages *p);
/* Bytes [off, off + len) into dst: how many (0 past the end), or -ENOMEM. */
ssize_t ckpt_tsv_pages_read(const ckpt_tsv_pages *p, uint64_t off, char *dst, size_t len);
void ckpt_tsv_pages_free(ckpt_tsv_pages *p);
/* The .npy header for the tensor's bytes (not NUL-terminated), NULL when numpy has no such
 * dtype or on ENOMEM. */
char *ckpt_npy_header(const ckpt_tensor *t, size_t *len);

#endif
