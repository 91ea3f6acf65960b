/* For the per-format writers in this folder: the table row each one defines, and the output
 * file (out_file.c) they write through. */
#ifndef CKPT_WRITERS_H
#define CKPT_WRITERS_H

#include "../../ckpt.h"
#include "../../util/pwrite_pieces.h"

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
    const ckpt_write_opts *publish; /* OUT itself (not a shard): its before_publish hook */
    int failed;                     /* sticky negative errno */
} out_file;

/* One row of the writer table (writer.c), defined at the end of the writer's file (writer.h
 * names the type for its users; a repeated typedef is valid C11). */
typedef struct ckpt_writer ckpt_writer;
struct ckpt_writer {
    const char *suffix; /* OUT's name ends in it (before a ".zst") */
    /* Writes one archive into an opened output file; the caller commits it, or aborts it when
     * this returns an error. A failed write may also just leave f->failed set. */
    int (*write)(out_file *f, const ckpt_catalog *cat, ckpt_err *err);
    /* Writes a directory OUT (DIR/, or --max-shard-size); NULL: the format has none (dir_ok). */
    int (*write_dir)(const ckpt_catalog *cat, const char *dir, const ckpt_write_opts *opts,
                     ckpt_err *err);
    bool zst_ok; /* NAME.EXT.zst writes the seekable zstd form of NAME.EXT */
};

/* compress: write the seekable zstd format of what the writer writes. */
int out_open(out_file *f, const char *path, bool compress, ckpt_err *err);
/* Takes from group and others the permission bits `sources` (the modes of the files OUT's
 * content comes from) do not give them. */
void out_limit_mode(out_file *f, mode_t sources);
/* The modes of the sources tensors and headers come from, ANDed (config and tokenizer files,
 * copied as they are, keep their own). */
mode_t out_data_sources_mode(const ckpt_catalog *cat);
void out_bytes(out_file *f, const void *p, size_t n);
void out_zeros(out_file *f, size_t n);
void out_le32(out_file *f, uint32_t v);
void out_le64(out_file *f, uint64_t v);
/* The tensor's logical bytes, planned and copied from its sources. When compressing, a tensor
 * that follows 256 KiB or more of the current frame starts a new one, so reading a tensor
 * decompresses little of its neighbours. */
void out_tensor(out_file *f, const ckpt_catalog *cat, const ckpt_tensor *t);
/* The bytes of planned segments; `what` names them in messages. */
void out_segments(out_file *f, const ckpt_catalog *cat, const ckpt_segment *seg, size_t n,
                  const char *what);
/* A whole virtual file, each part starting where a frame may end. */
void out_vfile(out_file *f, const ckpt_catalog *cat, const ckpt_vfile *vf);
/* True when the output is compressed: what was written can be neither read back nor patched. */
bool out_compressed(const out_file *f);
/* Bytes [off, off+len) of the tensor's logical bytes, read from its sources. */
int out_tensor_read(const ckpt_catalog *cat, const ckpt_tensor *t, uint64_t off, void *buf,
                    size_t len, ckpt_err *err);
/* Flushes, fsyncs and renames into place; on any earlier error removes the temporary file. */
int out_commit(out_file *f);
void out_abort(out_file *f);
/* fsync of the directory that holds path, so a rename into it is durable. */
int out_fsync_dir_of(const char *path);

/* Refuses (before anything is written) a directory OUT that exists and holds a file of cat's
 * sources, unless opts says OUT is the caller's own source (safetensors_dir.c). */
int writer_dir_guard(const ckpt_catalog *cat, const char *out, const ckpt_write_opts *opts,
                     ckpt_err *err);
/* A new private directory beside out for a directory OUT built under a temporary name
 * (".OUT.partial-XXXXXX", hidden and plainly unfinished) into tmp (cap bytes), or -errno with
 * err filled (safetensors_dir.c). */
int writer_dir_temp(const char *out, char *tmp, size_t cap, ckpt_err *err);
/* Swaps the finished directory tmp in place of the existing directory out, keeping what the
 * writer does not write (safetensors_dir.c). On failure out is unchanged. */
int writer_replace_dir(const char *tmp, const char *out, ckpt_err *err);

/* The config and tokenizer files of cat written into the directory tmp, and tmp given the
 * mode of a finished directory (safetensors.c). */
int writer_dir_aux(const ckpt_catalog *cat, const char *tmp, ckpt_err *err);
/* The finished directory tmp becomes out: renamed, or swapped with an existing out when
 * opts->replace_dir (writer_replace_dir), then the rename made durable. On failure tmp is left
 * for the caller to remove. */
int writer_publish_dir(const char *tmp, const char *out, const ckpt_write_opts *opts,
                       ckpt_err *err);

/* The model's tensors (not those aside), each passed through check(); two tensors of the model
 * with one name (under different directories) are refused, naming `container` ("a GGUF
 * file"). *out lists their catalog indexes; the caller frees it. */
int writer_select(const out_file *f, const ckpt_catalog *cat,
                  int (*check)(const out_file *, const ckpt_tensor *, ckpt_err *),
                  const char *container, size_t **out, size_t *count, ckpt_err *err);

#endif
