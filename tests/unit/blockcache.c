/* The block cache against a source that counts its fetches (block i holds bytes (i*7 + j) %
 * 251): reads copy the right bytes; a cached block is not fetched again; when the cache is full,
 * blocks already read leave it before prefetched ones nobody has read yet, but unread blocks
 * over half the cache go too (oldest first); blocks a sequential reader moved past leave first,
 * and beyond a 32nd of the cache even when there is room; a pinned block stays readable after
 * its object is forgotten, and leaves when unpinned. */
#include "io/blockcache.h"
#include "tap.h"

#include <stdatomic.h>
#include <stdlib.h>

enum { BLOCK = 4096, CAP_BLOCKS = 8 };

static _Atomic unsigned fetches[64];

static unsigned char byte_of(uint64_t index, size_t j) {
    return (unsigned char)((index * 7 + j) % 251);
}

static int fetch(void *ctx, uint64_t index, void *buf, size_t len, char *msg, size_t cap) {
    (void)ctx, (void)msg, (void)cap;
    for (size_t j = 0; j < len; j++) ((unsigned char *)buf)[j] = byte_of(index, j);
    if (index < 64) atomic_fetch_add(&fetches[index], 1);
    return 0;
}

static bool read_ok(const bc_source *src, uint64_t index) {
    unsigned char out[BLOCK];
    char msg[256];
    if (bc_read(src, index, BLOCK, 0, out, BLOCK, msg, sizeof msg) != 0) return false;
    for (size_t j = 0; j < BLOCK; j++)
        if (out[j] != byte_of(index, j)) return false;
    return true;
}

static void reset_counts(void) {
    for (size_t i = 0; i < 64; i++) atomic_store(&fetches[i], 0);
}

int main(void) {
    bc_config cfg = {.ram_cap = CAP_BLOCKS * BLOCK, .workers = 2};
    ok(bc_configure(&cfg) == 0, "configure: %d blocks of RAM", CAP_BLOCKS);
    bc_source src = {.id = 1, .fetch = fetch};

    /* Reads, and a second read of a cached block. */
    bool all = true;
    for (uint64_t i = 0; i < 4; i++) all &= read_ok(&src, i);
    ok(all, "blocks 0-3 read right");
    all &= read_ok(&src, 2);
    is_u64(atomic_load(&fetches[2]), 1, "a block read twice is fetched once");

    /* Four blocks read (0-3), then four prefetched and not read (10-13): the cache is full.
     * Two more blocks read (20, 21) push out the oldest blocks read (0, 1), not the unread. */
    for (uint64_t i = 10; i < 14; i++) bc_prefetch(&src, i, BLOCK);
    bc_quiesce();
    for (uint64_t i = 20; i < 22; i++) all &= read_ok(&src, i);
    reset_counts();
    for (uint64_t i = 10; i < 14; i++) all &= read_ok(&src, i);
    unsigned again = 0;
    for (uint64_t i = 10; i < 14; i++) again += atomic_load(&fetches[i]);
    is_u64(again, 0, "prefetched blocks nobody read stayed while read blocks left");
    all &= read_ok(&src, 0);
    is_u64(atomic_load(&fetches[0]), 1, "the oldest block read left the cache first");
    ok(all, "every block read so far is right");

    /* Unread blocks over half the cache: the oldest of them go before the newest read one. */
    bc_forget(1);
    /* 6 unread of 8, finished in this order (two workers at once could finish them in another:
     * the LRU order this checks). */
    for (uint64_t i = 30; i < 36; i++) {
        bc_prefetch(&src, i, BLOCK);
        bc_quiesce();
    }
    for (uint64_t i = 40; i < 43; i++) all &= read_ok(&src, i);
    reset_counts();
    all &= read_ok(&src, 30);
    all &= read_ok(&src, 35);
    is_u64(atomic_load(&fetches[30]), 1, "the oldest unread block left when unread were over half");
    is_u64(atomic_load(&fetches[35]), 0, "the newest unread block stayed");

    /* Blocks a sequential reader moved past, in a cache of 32 blocks: a 32nd of it (one block)
     * is kept, the oldest passed goes first, even with room to spare. */
    bc_forget(1);
    cfg.ram_cap = 32 * BLOCK;
    ok(bc_configure(&cfg) == 0, "configure: 32 blocks of RAM");
    for (uint64_t i = 52; i < 58; i++) all &= read_ok(&src, i);
    bc_passed(&src, 56);
    bc_passed(&src, 57);
    bc_stats bs;
    bc_get_stats(&bs);
    is_u64(bs.ram_blocks, 5, "two blocks passed with room to spare: the older one left");
    reset_counts();
    all &= read_ok(&src, 57);
    all &= read_ok(&src, 56);
    all &= read_ok(&src, 52);
    is_u64(atomic_load(&fetches[57]) * 10 + atomic_load(&fetches[56]) * 1 +
               atomic_load(&fetches[52]) * 100,
           1, "the newer passed block and the blocks read stayed, the older passed one did not");

    /* A full cache drops a passed block before the least recently used block read. */
    bc_forget(1);
    for (uint64_t i = 0; i < 31; i++) all &= read_ok(&src, i);
    bc_passed(&src, 1);
    all &= read_ok(&src, 31); /* 32 blocks: full */
    all &= read_ok(&src, 32); /* one over */
    reset_counts();
    all &= read_ok(&src, 0);
    all &= read_ok(&src, 1);
    is_u64(atomic_load(&fetches[0]), 0, "the least recently used block read stayed");
    is_u64(atomic_load(&fetches[1]), 1, "the passed block left first");

    /* A pinned block outlives bc_forget and is freed on unpin (sanitizers check the rest). */
    const char *data;
    void *hold;
    char msg[256];
    ok(bc_pin(&src, 50, BLOCK, &data, &hold, msg, sizeof msg) == 0 && data &&
           (unsigned char)data[5] == byte_of(50, 5),
       "bc_pin gives the block's bytes");
    bc_forget(1);
    ok((unsigned char)data[BLOCK - 1] == byte_of(50, BLOCK - 1),
       "a pinned block stays readable after its object is forgotten");
    bc_unpin(hold);
    reset_counts();
    all &= read_ok(&src, 50);
    is_u64(atomic_load(&fetches[50]), 1, "and is fetched again once unpinned and forgotten");
    ok(all, "every read was right");
    bc_quiesce();
    return tap_done();
}
