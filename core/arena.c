#include "arena.h"

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

void *arena_alloc(arena *a, size_t size) {
    if (size > SIZE_MAX / 2) return NULL;
    size_t need = (size + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    if (need == 0) need = ARENA_ALIGN;
    if (!a->head || a->cap - a->used < need) {
        size_t cap = need > ARENA_CHUNK / 2 ? need : ARENA_CHUNK - sizeof(arena_chunk);
        arena_chunk *c = malloc(sizeof(arena_chunk) + cap);
        if (!c) return NULL;
        if (a->head && cap == need) {
            /* An oversized block goes behind the head so the head's free space stays usable. */
            c->next = a->head->next;
            a->head->next = c;
            memset(c->align, 0, need);
            return c->align;
        }
        c->next = a->head;
        a->head = c;
        a->used = 0;
        a->cap = cap;
    }
    void *p = (char *)a->head->align + a->used;
    a->used += need;
    memset(p, 0, need);
    return p;
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
