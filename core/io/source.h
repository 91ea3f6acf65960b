/* Opening and closing sources: a local file (checked to be a regular one), a seekable .zst read
 * through its seek table, a member of a tar archive read in place, an object behind a URL, or
 * bytes made when read. What catalog.c calls to add one; the catalog keeps the array and the
 * names (path and relpath are left for it to set). Reading them: ckpt.h's ckpt_source_*. */
#ifndef CKPT_IO_SOURCE_H
#define CKPT_IO_SOURCE_H

#include "../ckpt.h"

#include <stddef.h>
#include <sys/types.h>

/* "a FIFO", "a directory", ... for messages. */
const char *source_file_type_name(mode_t mode);
/* Opens path (a local file or a URL) into *s: a local file's descriptor, size, times and
 * identity, and its seek table when it is a seekable zstd file; a URL's object, pinned now
 * (size, ETag), with the name it is shown by (no secrets) in shown (shown_cap bytes). Anything
 * but a regular file (a FIFO, a device) is refused by name without blocking. 0, or a negative
 * errno with err filled (then nothing is left open). */
int source_open(ckpt_source *s, const char *path, char *shown, size_t shown_cap, ckpt_err *err);
/* The member [base, base+size) of the archive source a, read in place: through a descriptor
 * of its own, or the archive's object when remote. The archive must be a plain file or object
 * (not a .zst, not itself a member); name, the member's, is for messages. s->relpath is left for
 * the caller. */
int source_open_member(ckpt_source *s, const ckpt_source *a, const char *name, uint64_t base,
                       uint64_t size, ckpt_err *err);
/* A source of size bytes made by ops when read (see ckpt_source.virt); it owns ctx. */
void source_open_virtual(ckpt_source *s, uint64_t size, const ckpt_virtual_ops *ops, void *ctx);
/* Frees what the source holds: its seek table, object, context and descriptor. */
void source_close(ckpt_source *s);

#endif
