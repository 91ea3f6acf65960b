/* A staged tree becomes a catalog. The staging mount (fs/stage_*.c) lists the files it holds;
 * this decides which files make up which tensor, checks every one of them, and either builds
 * the catalog that ckpt_write packs or lists every problem by path. No FUSE here.
 *
 * A tensor is
 *   NAME + NAME.json   raw little-endian bytes, and a sidecar with "dtype" and "shape"
 *   NAME.npy           a numpy file: its header gives dtype and shape
 * and a raw file that is also a directory's name is staged as NAME.raw (as mounts show it).
 * A copy of a read-only mount holds all three for one tensor. The raw file and its sidecar
 * then define the tensor and the .npy must agree with them (dtype, shape, bytes) to be left
 * out; without a raw file the .npy defines it. Anything that disagrees is a clash.
 *
 * The tensor's name is the sidecar's "name" when the file sits where that name is shown by a
 * mount (core/model/treepath.c: %XX escapes, %_ for an empty component, %~N for a repeated path,
 * abbreviated long components), so names that a path cannot carry survive a `cp -r` round trip.
 * Anywhere else (a file moved or copied to another place) the path gives the name: components
 * unescaped and joined with '.'. Files and directories whose name starts with '.' are ignored.
 * A Hugging Face folder's own files at the top (config.json, tokenizer.json, ... as listed in
 * core/formats/dirlist.c) are carried as they are, as the catalog's aux files, unless
 * config.json is the sidecar of a raw file "config" beside it. */
#ifndef CKPT_STAGED_H
#define CKPT_STAGED_H

#include "../ckpt.h"
#include "../util/strbuf.h"

typedef enum {
    STAGED_SPOOL,         /* bytes in a file of the spool */
    STAGED_LOWER_RAW,     /* the raw bytes of tensor `lower` of the source checkpoint */
    STAGED_LOWER_SIDECAR, /* the sidecar a mount shows for tensor `lower` of the source */
} staged_origin;

typedef struct staged_file {
    const char *path; /* relative to the staging root, '/' between components */
    staged_origin origin;
    const char *spool_path; /* STAGED_SPOOL: the file holding the bytes */
    uint64_t size;          /* STAGED_SPOOL: its size */
    uint64_t spool_offset;  /* STAGED_SPOOL: where the file's bytes start in spool_path */
    size_t lower;           /* STAGED_LOWER_*: tensor index in the source catalog */
} staged_file;

/* What a build found. Problem lines read "PATH: what is wrong" (control bytes shown as \xNN),
 * sorted by path; notes say what was left out on purpose. */
typedef struct staged_report {
    char **problems;
    size_t nproblems, cap_problems;
    char **notes;
    size_t nnotes, cap_notes;
    size_t ntensors;
    uint64_t nbytes;
    /* After a build: for each staged file, the name of the tensor it gave its bytes or its
     * sidecar to (pointing into the built catalog, so valid while it is open), or NULL for a
     * file that is no part of a tensor (hidden, an .npy left out as a copy). A stage that
     * replaced its own source with the commit finds each file's tensor in the new one. */
    const char **file_tensor;
    size_t *file_tensor_len;
} staged_report;

/* Builds the catalog of the staged files. `lower` is the source checkpoint of an overlay, or
 * NULL; its files are opened again, and a source file that changed since `lower` was opened is
 * a problem. Returns 0 with *out set; -EINVAL when problems were found (listed in rep, *out is
 * NULL); another negative errno with err filled when the check itself could not run. */
int staged_build(const staged_file *files, size_t nfiles, const ckpt_catalog *lower,
                 const char *root, ckpt_catalog **out, staged_report *rep, ckpt_err *err);
void staged_report_free(staged_report *rep);

/* ---- used by staged.c; exposed for tests and the mount ---- */

/* The tensor name a path stands for (core/model/treepath.c undone): false when a component was
 * abbreviated (%#...), so only a sidecar can give the name. */
bool staged_name_from_path(const char *path, size_t len, strbuf *name);
/* True when `path` is where a mount shows the tensor called name[0..len). */
bool staged_path_shows_name(const char *path, size_t plen, const char *name, size_t len);

#endif
