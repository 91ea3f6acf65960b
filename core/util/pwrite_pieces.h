/* Writing a buffer into the page cache in pieces (pwrite_pieces.c). */
#ifndef CKPT_PWRITE_PIECES_H
#define CKPT_PWRITE_PIECES_H

#include <stddef.h>
#include <stdint.h>

/* At most this much a write: the kernel sizes a page-cache folio after the write that fills
 * it, and a large folio needs a block of free memory that compaction may first have to make.
 * Measured on this project's VMs (6.18 kernel, ext4, 2 GiB written, rounds side by side):
 * 0.5-1.8 s in 64 KiB writes, 1.0-5.8 s in 4 MiB writes; `cp` of 2 GiB into a stage spent
 * ~3 s of daemon CPU in copy_folio_from_iter_atomic with 1 MiB pwrites, ~0.95 s with 64 KiB
 * ones. Elsewhere the pieces cost a few syscalls per MiB. */
enum { PWRITE_PIECE = 64 << 10 };

/* All n bytes of p at `at` of fd, PWRITE_PIECE at a time, retrying EINTR and short writes.
 * Returns 0, or a negative errno (-ENOSPC for a write that wrote nothing), as every core call. */
int pwrite_pieces(int fd, const void *p, size_t n, uint64_t at);

#endif
