#include "heap.h"

#include <malloc.h>

/* Opening a sharded checkpoint parses tens of MB of JSON into blocks that live for one file.
 * By default glibc maps every block over 128 KiB on its own and unmaps it when freed, so the
 * next file faults all of those pages in again (a third of the page faults of a 100k-tensor
 * mount). While loading, big blocks come from the heap and freed ones are reused. */
void heap_for_loading(void) {
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
}

/* Before the daemon forks and serves: what loading left free goes back (the daemon's resident
 * size is what users see), and later frees return memory as they usually do. */
void heap_for_serving(void) {
    malloc_trim(0);
    mallopt(M_MMAP_THRESHOLD, 128 << 10);
    mallopt(M_TRIM_THRESHOLD, 128 << 10);
}
