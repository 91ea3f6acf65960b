/* A cache of fixed-size blocks of remote objects: RAM up to a cap (least recently used blocks
 * go first), optionally a folder on disk that survives remounts, prefetch on worker threads,
 * and one fetch per block however many readers want it at once. The cache knows nothing of
 * HTTP: a source says how to fetch block i of an object. */
#ifndef CKPT_BLOCKCACHE_H
#define CKPT_BLOCKCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct bc_source {
    uint64_t id;          /* unique per object (and per pinned version of it) */
    const char *disk_key; /* file-name-safe key of the object's content (URL + ETag), or NULL */
    /* Fills buf with block `index` (len bytes). 0 or a negative errno with msg filled. */
    int (*fetch)(void *ctx, uint64_t index, void *buf, size_t len, char *msg, size_t cap);
    void *ctx;
    void (*hold)(void *ctx); /* keeps ctx alive while a prefetch of it is queued */
    void (*release)(void *ctx);
} bc_source;

typedef struct bc_config {
    uint64_t ram_cap;     /* bytes of blocks kept in RAM */
    const char *disk_dir; /* NULL: no disk cache */
    uint64_t disk_cap;    /* bytes kept in disk_dir */
    unsigned workers;     /* prefetches in flight */
} bc_config;

int bc_configure(const bc_config *c);
/* Copies n bytes at `at` inside block index (block_len bytes long) to out, fetching the block
 * unless it is cached or on its way. 0 or a negative errno with msg filled. */
int bc_read(const bc_source *src, uint64_t index, size_t block_len, size_t at, void *out, size_t n,
            char *msg, size_t cap);
/* The block itself instead of a copy: *data is its first byte (block_len bytes), valid and
 * kept in the cache until bc_unpin(*hold). 0 or a negative errno with msg filled. */
int bc_pin(const bc_source *src, uint64_t index, size_t block_len, const char **data, void **hold,
           char *msg, size_t cap);
void bc_unpin(void *hold);
/* Puts a block the caller already has into the cache (the first block of an object, fetched
 * while pinning it). */
void bc_insert(const bc_source *src, uint64_t index, const void *data, size_t len);
/* Starts fetching the block on a worker unless it is cached or on its way. */
void bc_prefetch(const bc_source *src, uint64_t index, size_t block_len);
/* A sequential reader has moved past block index: the cache keeps a few such blocks (for a
 * reader close behind) and drops them before any other. */
void bc_passed(const bc_source *src, uint64_t index);
/* Waits for queued prefetches and stops the workers (before fork; they restart on demand). */
void bc_quiesce(void);
/* Drops every RAM block of object id (its object changed or closed). */
void bc_forget(uint64_t id);

typedef struct bc_stats {
    uint64_t hits, misses, waits, prefetches, disk_hits, disk_writes, ram_bytes, ram_blocks;
    uint64_t ram_cap, block_fetches, fetch_bytes;
} bc_stats;
void bc_get_stats(bc_stats *out);

#endif
