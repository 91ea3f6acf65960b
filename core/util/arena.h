/* Bump allocator for data that lives as long as its owner (catalog, parsed JSON). */
#ifndef CKPT_ARENA_H
#define CKPT_ARENA_H

#include <stddef.h>

typedef struct arena_chunk arena_chunk;

typedef struct arena {
    arena_chunk *head;
    size_t used; /* bytes used in head */
    size_t cap;  /* capacity of head */
} arena;

void arena_init(arena *a);
void arena_free(arena *a);
/* 16-byte aligned, zeroed; NULL only when out of memory or on size overflow. */
void *arena_alloc(arena *a, size_t size);
void *arena_array(arena *a, size_t count, size_t elem_size);
/* Zeroed, aligned to `align` (a power of two up to 16): arrays of u64 ask for 8. */
void *arena_alloc_aligned(arena *a, size_t size, size_t align);
/* Copies len bytes and appends a NUL, packed (no alignment, not zeroed): for an arena that
 * holds only text. With src NULL, the len bytes are left for the caller to fill. */
char *arena_text(arena *a, const void *src, size_t len);
/* Forgets everything allocated but keeps the newest chunk for reuse: a scratch arena that
 * holds one item at a time costs one malloc, not one per item. */
void arena_reset(arena *a);
/* Copies len bytes and appends a NUL (names may contain NUL; callers keep len). */
char *arena_memdup(arena *a, const void *src, size_t len);
char *arena_strdup(arena *a, const char *s);

#endif
