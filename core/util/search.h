/* Binary search over sorted offsets, the lookup of every paged or split file. */
#ifndef CKPT_SEARCH_H
#define CKPT_SEARCH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The last i < n whose item starts with a uint64_t <= v (items of `size` bytes, ascending by
 * that first member); 0 when there is none or n is 0. */
static inline size_t last_at_or_before_in(const void *items, size_t size, size_t n, uint64_t v) {
    size_t lo = 0, hi = n;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        uint64_t at;
        memcpy(&at, (const char *)items + mid * size, sizeof at);
        if (at <= v)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* The last i < n with a[i] <= v (a ascending); 0 when there is none or n is 0. */
static inline size_t last_at_or_before(const uint64_t *a, size_t n, uint64_t v) {
    return last_at_or_before_in(a, sizeof *a, n, v);
}

#endif
