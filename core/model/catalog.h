/* Building a catalog: what decoders call. Tensors are added by index (the array grows), pieces
 * may arrive in any order, and catalog_finish validates everything and freezes the result. */
#ifndef CKPT_CATALOG_H
#define CKPT_CATALOG_H

#include "../util/arena.h"
#include "../ckpt.h"
#include "../util/strbuf.h"
#include "../util/err.h"
#include "../io/source.h" /* source_file_type_name */

typedef struct pending_piece {
    size_t tensor;
    ckpt_piece piece;
} pending_piece;

struct ckpt_catalog_private {
    arena mem;
    arena text;      /* names and tree paths, packed (no alignment): most of a catalog's bytes */
    uint64_t *zeros; /* CKPT_MAX_DIMS zeros: the offsets of every piece at the origin */
    size_t cap_tensors, cap_sources, cap_docs, cap_aux, cap_warnings;
    size_t docs_bytes; /* sum of the documents' lengths, against CKPT_METADATA_LIMIT */
    pending_piece *pieces;
    size_t npieces, cap_pieces;
    char *tsv; /* tensors.tsv, built on first use */
    size_t tsv_len;
};

ckpt_catalog *catalog_new(const char *root, const char *format);
/* Opens path read-only and records its size and mtime. relpath is what sidecars show.
 * Anything but a regular file (a FIFO, a device) is refused by name without blocking. */
int catalog_add_source(ckpt_catalog *cat, const char *path, const char *relpath, uint32_t *index,
                       ckpt_err *err);
/* Registers a virtual source of `size` bytes named `name` (see ckpt_source.virt); the catalog
 * owns ctx once this succeeds. */
int catalog_add_virtual_source(ckpt_catalog *cat, const char *name, uint64_t size,
                               const ckpt_virtual_ops *ops, void *ctx, uint32_t *index,
                               ckpt_err *err);
/* A virtual source holding `bytes` (len of them, malloc'd): the catalog owns them from this call
 * on, whether it succeeds or not (memory_source.c). */
int catalog_add_memory_source(ckpt_catalog *cat, const char *name, unsigned char *bytes, size_t len,
                              uint32_t *index, ckpt_err *err);
/* Registers the member `name` of the tar archive `archive` (a registered source): its `size`
 * bytes at `base` of the archive file, read in place through a descriptor of its own. */
int catalog_add_member(ckpt_catalog *cat, uint32_t archive, const char *name, uint64_t base,
                       uint64_t size, uint32_t *index, ckpt_err *err);
/* Room for n more tensors, so that a decoder that knows its count (a safetensors header) does
 * not grow the table by doubling: at a million tensors that copied 100 MB and held both. */
int catalog_reserve_tensors(ckpt_catalog *cat, size_t n, ckpt_err *err);
/* Adds a tensor; returns its index via *index. The name is copied. shape may be NULL if ndim=0. */
int catalog_add_tensor(ckpt_catalog *cat, const char *name, size_t name_len, ckpt_dtype dtype,
                       uint32_t ndim, const uint64_t *shape, size_t *index, ckpt_err *err);
/* Adds a piece to tensor `index`. offsets NULL = origin, sizes NULL = full shape, strides NULL =
 * row-major contiguous. Arrays are copied. */
int catalog_add_piece(ckpt_catalog *cat, size_t index, uint32_t source, uint64_t file_offset,
                      const uint64_t *offsets, const uint64_t *sizes, const uint64_t *strides,
                      ckpt_err *err);
/* Adds to tensor `to` the pieces tensor `from` has so far, in their order (a parameter shared
 * by two names). Before catalog_finish, a tensor's first piece is t->pieces[0] (npieces 1)
 * and the others wait in a pending list. */
int catalog_copy_pieces(ckpt_catalog *cat, size_t from, size_t to, ckpt_err *err);
/* Shows the tensor under the directory `prefix` ("optim/", ".ckptfs/ranks/0/"); `aside` keeps
 * it out of the model (HF view, totals). Names need only be unique within one prefix. */
int catalog_set_prefix(ckpt_catalog *cat, size_t index, const char *prefix, bool aside,
                       ckpt_err *err);
/* The tensor's format-specific sidecar members as text (`"k": v, ...`), copied. */
int catalog_set_extra(ckpt_catalog *cat, size_t index, const char *json_members, ckpt_err *err);
/* The same as a record of the format's own kind (ckpt_extra), rendered when a sidecar is read;
 * the record and what it points to must live as long as the catalog (its arena). */
void catalog_set_extra_record(ckpt_catalog *cat, size_t index, const ckpt_extra *extra);
/* metadata.json holds at most CKPT_METADATA_LIMIT bytes of documents: one that would pass it
 * is replaced by {"truncated": ...} and a warning says so in summary.json. Renderers whose text
 * can outgrow their input (a pickle value referenced many times) stop at CKPT_DOC_LIMIT with a
 * marker of their own. Both keep the memory a mount holds for its documents bounded whatever
 * the input. */
enum { CKPT_METADATA_LIMIT = 64 << 20, CKPT_DOC_LIMIT = 16 << 20 };
int catalog_add_doc(ckpt_catalog *cat, const char *key, const char *json, size_t len,
                    ckpt_err *err);
int catalog_add_aux(ckpt_catalog *cat, const char *name, uint32_t source, ckpt_err *err);
int catalog_set_summary_extra(ckpt_catalog *cat, const char *json_members, ckpt_err *err);
/* Renames the documents from index `first` on to "PREFIX/KEY", so that several files of one
 * format (the shards of a .bin repo) keep one document each in metadata.json. */
int catalog_prefix_docs(ckpt_catalog *cat, size_t first, const char *prefix, ckpt_err *err);
int catalog_warn(ckpt_catalog *cat, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Sorts tensors by name, refuses duplicate names, checks every piece against its tensor and its
 * file, builds piece indexes and tree paths. */
int catalog_finish(ckpt_catalog *cat, ckpt_err *err);

/* numel and nbytes of a shape, with overflow checks; false on overflow or a partial byte. */
bool catalog_shape_nbytes(const uint64_t *shape, uint32_t ndim, ckpt_dtype dt, uint64_t *numel,
                          uint64_t *nbytes);

/* Planner internals used by catalog_finish. */
int planner_piece_index_build(ckpt_catalog *cat, ckpt_tensor *t, ckpt_err *err);
void planner_piece_index_free(ckpt_piece_index *ix);

/* Tree paths (treepath.c). */
int treepath_assign(ckpt_catalog *cat, ckpt_err *err);
/* One name component as the tree shows it (%XX, %_), before any shortening. */
void treepath_escape_component(strbuf *sb, const char *p, size_t n);
/* The hash after "%#" in a shortened component: FNV-1a 64, as ckptfs(5) documents. */
uint64_t treepath_hash(const char *p, size_t n);

#endif
