/* Reading strided pieces: a tensor saved as a transposed or permuted view of its storage has no
 * two logically adjacent elements next to each other in the file. Planned element by element it
 * costs a segment and a system call per element (6.5 MB/s for a transposed 16 MiB F32 matrix).
 *
 * Here the logical bytes are materialized a band at a time (a few MiB of whole rows of the
 * tensor): the band's footprint in the file is read in large chunks and copied element by
 * element in an order that keeps both the chunk's lines and the band's lines in cache. Bands are
 * kept in a small process-wide cache, so a sequential reader fills each band once. */
#ifndef CKPT_STRIDED_H
#define CKPT_STRIDED_H

#include "../ckpt.h"

/* The scratch buffer strided_read may be given holds at least this many bytes (segread.c's
 * gather window is checked to be as large). */
enum { STRIDED_SCRATCH = 1 << 20 };
/* Fills dst with the seg->length bytes of the CKPT_SEG_STRIDED segment seg. scratch is
 * SEGREAD_SCRATCH bytes or NULL. Returns 0, -EIO for a source that ended early or changed, or
 * another negative errno, as every core call. Safe to call from many threads. */
int strided_read(const ckpt_catalog *cat, const ckpt_segment *seg, char *dst, char *scratch);
/* Lets the process share the filling of a band with worker threads (one per other CPU). Off
 * until called: a daemon calls it once it has forked, since threads do not survive a fork. */
void strided_workers_allow(void);

#endif
