#include "arena.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct arena_chunk {
    arena_chunk *next;
    max_align_t align[]; /* payload starts aligned */
};

/* Large chunks are mmap-backed by glibc, so freeing an arena returns memory to the system. */
enum { ARENA_CHUNK = 1 << 20, ARENA_ALIGN = 16 };

void arena_init(arena *a) {
    a->head = NULL;
    a->used = a->cap = 0;
}

void arena_free(arena *a) {
    arena_chunk *c = a->head;
    while (c) {
        arena_chunk *next = c->next;
        free(c);
        c = next;
    }
    arena_init(a);
}

/* `align` is a power of two up to ARENA_ALIGN. Text (names, paths) asks for 1: a 9-byte name
 * then takes 10 bytes instead of 16, which at a million tensors is what decides whether a
 * header's memory stays a small multiple of its size. */
static void *alloc_aligned(arena *a, size_t size, size_t align, bool zero) {
    if (size > SIZE_MAX / 2) return NULL;
    size_t need = size ? size : 1;
    size_t at = a->head ? (a->used + align - 1) & ~(align - 1) : 0;
    if (!a->head || at > a->cap || a->cap - at < need) {
        size_t cap = need > ARENA_CHUNK / 2 ? need : ARENA_CHUNK - sizeof(arena_chunk);
        arena_chunk *c = malloc(sizeof(arena_chunk) + cap);
        if (!c) return NULL;
        if (a->head && cap == need) {
            /* An oversized block goes behind the head so the head's free space stays usable. */
            c->next = a->head->next;
            a->head->next = c;
            if (zero) memset(c->align, 0, need);
            return c->align;
        }
        c->next = a->head;
        a->head = c;
        a->cap = cap;
        at = 0;
    }
    void *p = (char *)a->head->align + at;
    a->used = at + need;
    if (zero) memset(p, 0, need);
    return p;
}

void *arena_alloc(arena *a, size_t size) {
    return alloc_aligned(a, size, ARENA_ALIGN, true);
}

void *arena_alloc_aligned(arena *a, size_t size, size_t align) {
    if (!align || align > ARENA_ALIGN || (align & (align - 1))) return NULL;
    return alloc_aligned(a, size, align, true);
}

char *arena_text(arena *a, const void *src, size_t len) {
    if (len == SIZE_MAX) return NULL;
    char *p = alloc_aligned(a, len + 1, 1, false);
    if (!p) return NULL;
    if (src && len) memcpy(p, src, len);
    p[len] = '\0';
    return p;
}

void arena_reset(arena *a) {
    arena_chunk *keep = a->head;
    if (!keep) return;
    arena_chunk *c = keep->next;
    while (c) {
        arena_chunk *next = c->next;
        free(c);
        c = next;
    }
    keep->next = NULL;
    a->used = 0;
}

void *arena_array(arena *a, size_t count, size_t elem_size) {
    if (elem_size && count > SIZE_MAX / 4 / elem_size) return NULL;
    return arena_alloc(a, count * elem_size);
}

char *arena_memdup(arena *a, const void *src, size_t len) {
    if (len == SIZE_MAX) return NULL;
    char *p = arena_alloc(a, len + 1);
    if (p && len) memcpy(p, src, len);
    return p;
}

char *arena_strdup(arena *a, const char *s) {
    return arena_memdup(a, s, strlen(s));
}
