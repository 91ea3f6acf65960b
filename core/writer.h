/* Writers: a catalog streamed into a new archive, never holding tensors in memory. The output
 * is written to a temporary file in the destination's directory, fsynced and renamed over the
 * destination, so a failure (or a kill) never leaves a partial or half-replaced OUT. */
#ifndef CKPT_WRITER_H
#define CKPT_WRITER_H

#include "ckpt.h"

typedef struct ckpt_progress {
    void (*report)(void *ctx, uint64_t done, uint64_t total);
    void *ctx;
} ckpt_progress;

typedef struct ckpt_write_opts {
    uint64_t max_shard_size; /* safetensors: > 0 writes an HF directory with an index */
    ckpt_progress progress;
} ckpt_write_opts;

/* The output format follows OUT's name: .safetensors, a directory (HF shards + index), .gguf,
 * .bpk, .lwt, .gptrs (GPTRSCHK) / .gptrsten (GPTRSTEN). */
int ckpt_write(const ckpt_catalog *cat, const char *out, const ckpt_write_opts *opts,
               ckpt_err *err);

/* ---- for the per-format writers in core/writers/ ---- */

typedef struct out_file {
    char *final_path;
    char *temp_path;
    int fd;
    uint64_t written;
    unsigned char *buf; /* write buffer */
    size_t buf_len;
    const ckpt_progress *progress;
    uint64_t progress_total;
    uint64_t *progress_done; /* shared across the files of one job */
    ckpt_err *err;
    int failed; /* sticky negative errno */
} out_file;

int out_open(out_file *f, const char *path, ckpt_err *err);
void out_bytes(out_file *f, const void *p, size_t n);
void out_zeros(out_file *f, size_t n);
/* The tensor's logical bytes, planned and copied from its sources. */
void out_tensor(out_file *f, const ckpt_catalog *cat, const ckpt_tensor *t);
/* Flushes, fsyncs and renames into place; on any earlier error removes the temporary file. */
int out_commit(out_file *f);
void out_abort(out_file *f);

/* The model's tensors (not those aside), each passed through check(); two tensors of the model
 * with one name (under different directories) are refused, naming `container` ("a GGUF
 * file"). *out lists their catalog indexes; the caller frees it. */
int writer_select(const out_file *f, const ckpt_catalog *cat,
                  int (*check)(const out_file *, const ckpt_tensor *, ckpt_err *),
                  const char *container, size_t **out, size_t *count, ckpt_err *err);

/* Per-format writers: they write one archive to an opened out_file. */
int write_gguf(out_file *f, const ckpt_catalog *cat, ckpt_err *err);
int write_burnpack(out_file *f, const ckpt_catalog *cat, ckpt_err *err);
int write_lwt(out_file *f, const ckpt_catalog *cat, ckpt_err *err);
int write_gptrs(out_file *f, const ckpt_catalog *cat, bool archive, ckpt_err *err);

#endif
