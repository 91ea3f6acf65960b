/* Writers: a catalog streamed into a new archive, never holding tensors in memory. The output
 * is written to a temporary file in the destination's directory, fsynced and renamed over the
 * destination, so a failure (or a kill) never leaves a partial or half-replaced OUT. */
#ifndef CKPT_WRITER_H
#define CKPT_WRITER_H

#include "../ckpt.h"

#include <sys/types.h>

/* The output format follows OUT's name (the table in writer.c): .safetensors, a directory (HF
 * shards + index), .gguf, .bpk, .lwt, .gptrs (GPTRSCHK) / .gptrsten (GPTRSTEN). NAME.EXT.zst is
 * the file NAME.EXT would be, in the zstd seekable format: frames of at most 1 MiB, ended
 * between tensors once they hold 256 KiB, and the seek table. */
int ckpt_write(const ckpt_catalog *cat, const char *out, const ckpt_write_opts *opts,
               ckpt_err *err);

/* Whether ckpt_write would know what to write for OUT's name (and opts' sharding): 0, or the
 * message ckpt_write would fail with, for a caller that refuses before doing any work. */
int ckpt_write_check_name(const char *out, const ckpt_write_opts *opts, ckpt_err *err);

/* ckpt_write's refusals that need no writing, for a caller that refuses before it does its own
 * work (a stage, before it cuts its packs): the name (ckpt_write_check_name), and a directory
 * OUT that exists and holds a file of cat's sources (unless opts->replaces_own_source), which
 * replacing it would remove. 0, or the message ckpt_write would fail with. */
int ckpt_write_check(const ckpt_catalog *cat, const char *out, const ckpt_write_opts *opts,
                     ckpt_err *err);

typedef struct ckpt_writer ckpt_writer;
/* The writer ckpt_write would use for OUT (a trailing '/' or an existing directory asks for a
 * directory), or NULL when the name says no format ckptfs writes. */
const ckpt_writer *ckpt_writer_for(const char *out);
/* The suffixes of the table, ".safetensors, .gguf, ...", for messages and usage texts. */
const char *ckpt_writer_suffixes(void);
/* The process's umask, read without changing it (so it is safe while other threads create
 * files), for outputs that start as private temporary files and get the usual mode at the end. */
mode_t ckpt_umask(void);

#endif
