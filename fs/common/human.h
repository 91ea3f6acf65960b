/* Numbers for people, shared by the cli's reports, the stage's progress and serve's pages. */
#ifndef CKPTFS_HUMAN_H
#define CKPTFS_HUMAN_H

#include <stddef.h>
#include <stdint.h>

/* 1536 -> "1.5 KiB" (powers of 1024). */
void human_size(uint64_t bytes, char *out, size_t cap);
/* 6738415616 -> "6.7B", 124439808 -> "124M" (powers of 1000, as model cards count). */
void human_count(uint64_t n, char *out, size_t cap);
/* 6738415616 -> "6,738,415,616" */
void human_grouped(uint64_t n, char *out, size_t cap);

#endif
