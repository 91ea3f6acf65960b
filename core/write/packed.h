/* Safetensors files whose tensor bytes a caller has laid out itself, finished by the writer: a
 * stage appends staged tensors to files of its spool (its packs, fs/stage/stage_pack*.c) and a
 * commit only adds headers and an index. The header, the index, the shard names and what a
 * finished directory holds are the safetensors writer's (views/st_layout.c, write/writers/),
 * so a packed OUT is byte for byte the file or directory ckpt_write would write for the same
 * tensors in the same order. */
#ifndef CKPT_PACKED_H
#define CKPT_PACKED_H

#include "../ckpt.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A tensor of the catalog and its first byte in a file. */
typedef struct ckpt_placed {
    size_t tensor;
    uint64_t off;
} ckpt_placed;

/* Whether the safetensors writer can hold t (dtype, complete, a name a header can hold): what
 * it would refuse, a caller leaves to ckpt_write, which then says why. */
bool ckpt_packed_fits(const ckpt_tensor *t);

/* The safetensors header of the tensors p[0..n) (in the order of their bytes, the data section
 * starting at data_start) padded with spaces to data_start, into a malloc'd buffer of
 * data_start bytes: 0, 1 when the names do not fit in front of data_start, or -ENOMEM. */
int ckpt_packed_header(const ckpt_catalog *cat, const ckpt_placed *p, size_t n, uint64_t data_start,
                       char **head);
/* The same header written at the start of fd: 0, 1 (does not fit), or -errno. */
int ckpt_packed_write_header(int fd, const ckpt_catalog *cat, const ckpt_placed *p, size_t n,
                             uint64_t data_start);
/* Whether fd starts with exactly that header. */
bool ckpt_packed_header_is(int fd, const ckpt_catalog *cat, const ckpt_placed *p, size_t n,
                           uint64_t data_start);

/* Whether the safetensors file behind fd (size bytes) holds exactly the tensors p[0..n)
 * (sorted by off), each at its offset with its name, dtype and shape, nothing else, and ends
 * where its data ends: then it is a shard of them as it is, whatever wrote its header. */
bool ckpt_packed_holds_exactly(const ckpt_catalog *cat, int fd, uint64_t size, const ckpt_placed *p,
                               size_t n);
/* Where the safetensors file behind fd (size bytes) keeps each tensor of cat that is not aside,
 * when its header holds exactly those tensors (by name, dtype and shape, nothing else) and the
 * file ends where its data ends: 0 with *out (malloc'd, one per such tensor, in the header's
 * order) and *n, 1 when the file is not their layout, or -ENOMEM. */
int ckpt_packed_layout(const ckpt_catalog *cat, int fd, uint64_t size, ckpt_placed **out,
                       size_t *n);

/* The scratch buffer ckpt_packed_append may be given holds this many bytes. */
enum { CKPT_PACKED_BUF = 1 << 20 };

/* Appends tensor t's logical bytes at `at` of fd, from its sources: copy_file_range (which
 * shares extents where the file system can), else through buf (CKPT_PACKED_BUF bytes); *done
 * grows by what was appended (progress shown while it runs). The copied bytes are a file's own
 * only if it is still the one the catalog saw: -EIO when it changed. 0 or -errno. */
int ckpt_packed_append(const ckpt_catalog *cat, const ckpt_tensor *t, int fd, uint64_t at,
                       char *buf, _Atomic uint64_t *done);
/* Sorts tensor indexes widest element first: appended tensors stay aligned to their element
 * size as long as what is in the file already is. */
void ckpt_packed_sort_widest(const ckpt_catalog *cat, size_t *tensors, size_t n);

/* A single safetensors OUT made of a pack: fd (a file whose first data_start bytes are kept
 * for the header) holds some of cat's tensors already, the caller's files end at live_end.
 * When the tensors of cat that are in fd tile it from data_start without a gap and nothing
 * else lies beyond them, the other tensors are appended (widest first), the header is written
 * in front, the file is cut to its end, given the usual mode (0666 less the umask) and fsynced:
 * 0, and fd is the
 * finished OUT (the caller puts it in place). 1 when the pack cannot be OUT as it is (a hole,
 * a tensor safetensors cannot hold, a header that does not fit): ckpt_write then writes OUT
 * whole, which is the compaction. -errno with err filled (`out` names OUT in messages). On
 * 1 or an error, bytes appended beyond live_end are the caller's to cut. */
int ckpt_packed_finish_file(const ckpt_catalog *cat, int fd, uint64_t data_start, uint64_t live_end,
                            char *buf, _Atomic uint64_t *done, const char *out, ckpt_err *err);

/* A finished shard: a safetensors file (header written) whose tensors are t[0..n) in the order
 * of their bytes. */
typedef struct ckpt_packed_shard {
    int fd;
    const ckpt_placed *t;
    size_t n;
    bool keep_mode; /* a shard of OUT already, linked again: its mode stays */
} ckpt_packed_shard;

/* The directory OUT of the shards s[0..n) (in shard order): a directory beside OUT gets a hard
 * link to each shard under its name (model.safetensors, or model-0000i-of-0000N.safetensors and
 * the index), the config and tokenizer files of cat, and then replaces OUT as the directory
 * writer's does (opts: replace_dir, before_publish). Shards get the mode the writer gives its
 * files. Every shard must be on OUT's file system. 0, or -errno with err filled (OUT
 * unchanged). */
int ckpt_write_packed_dir(const ckpt_catalog *cat, const char *out, const ckpt_packed_shard *s,
                          size_t n, const ckpt_write_opts *opts, ckpt_err *err);

#endif
