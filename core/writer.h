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
    bool replace_dir;        /* an HF directory OUT that exists is replaced (else: refused) */
    ckpt_progress progress;
} ckpt_write_opts;

/* The output format follows OUT's name: .safetensors, a directory (HF shards + index), .gguf,
 * .bpk, .lwt, .gptrs (GPTRSCHK) / .gptrsten (GPTRSTEN). NAME.EXT.zst is the file NAME.EXT would
 * be, in the zstd seekable format: frames of at most 1 MiB, ended between tensors once they hold
 * 256 KiB, and the seek table. */
int ckpt_write(const ckpt_catalog *cat, const char *out, const ckpt_write_opts *opts,
               ckpt_err *err);

/* ---- for the per-format writers in core/writers/ ---- */

typedef struct out_file {
    char *final_path;
    char *temp_path;
    int fd;
    uint64_t written;   /* bytes of the format written so far (before compression) */
    uint64_t file_at;   /* bytes in the file so far */
    unsigned char *buf; /* write buffer; when compressing, the frame being filled */
    size_t buf_len;
    size_t buf_cap;
    struct zst_writer *zst; /* OUT is a seekable .zst */
    char *gather;           /* scratch for reading row fragments together (segread.h) */
    const ckpt_progress *progress;
    uint64_t progress_total;
    uint64_t *progress_done; /* shared across the files of one job */
    ckpt_err *err;
    int failed; /* sticky negative errno */
} out_file;

/* compress: write the seekable zstd format of what the writer writes. */
int out_open(out_file *f, const char *path, bool compress, ckpt_err *err);
/* Takes from group and others the permission bits `sources` (the modes of the files OUT's
 * content comes from) do not give them. */
void out_limit_mode(out_file *f, mode_t sources);
void out_bytes(out_file *f, const void *p, size_t n);
void out_zeros(out_file *f, size_t n);
/* The tensor's logical bytes, planned and copied from its sources. When compressing, a tensor
 * that follows 256 KiB or more of the current frame starts a new one, so reading a tensor
 * decompresses little of its neighbours. */
void out_tensor(out_file *f, const ckpt_catalog *cat, const ckpt_tensor *t);
/* True when the output is compressed: what was written can be neither read back nor patched. */
bool out_compressed(const out_file *f);
/* Bytes [off, off+len) of the tensor's logical bytes, read from its sources. */
int tensor_read(const ckpt_catalog *cat, const ckpt_tensor *t, uint64_t off, void *buf, size_t len,
                ckpt_err *err);
/* Flushes, fsyncs and renames into place; on any earlier error removes the temporary file. */
int out_commit(out_file *f);
void out_abort(out_file *f);

/* The model's tensors (not those aside), each passed through check(); two tensors of the model
 * with one name (under different directories) are refused, naming `container` ("a GGUF
 * file"). *out lists their catalog indexes; the caller frees it. */
int writer_select(const out_file *f, const ckpt_catalog *cat,
                  int (*check)(const out_file *, const ckpt_tensor *, ckpt_err *),
                  const char *container, size_t **out, size_t *count, ckpt_err *err);

/* Swaps the finished directory tmp in place of the existing directory out, keeping what the
 * writer does not write (writer_dir.c). On failure out is unchanged. */
int writer_replace_dir(const char *tmp, const char *out, ckpt_err *err);

/* Per-format writers: they write one archive to an opened out_file. */
int write_gguf(out_file *f, const ckpt_catalog *cat, ckpt_err *err);
int write_burnpack(out_file *f, const ckpt_catalog *cat, ckpt_err *err);
int write_lwt(out_file *f, const ckpt_catalog *cat, ckpt_err *err);
int write_gptrs(out_file *f, const ckpt_catalog *cat, bool archive, ckpt_err *err);

#endif
