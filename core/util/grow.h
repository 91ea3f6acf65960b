/* Growing a heap array by doubling: what every list that is built one item at a time uses. */
#ifndef CKPT_GROW_H
#define CKPT_GROW_H

#include <stddef.h>

/* Makes *arr (room for *cap elements of elem bytes) hold at least need elements: 0, or -ENOMEM
 * with *arr and *cap unchanged. */
int grow_array(void **arr, size_t *cap, size_t need, size_t elem);

/* grow_array for a typed array: GROW(list, cap, n + 1). */
#define GROW(arr, cap, need) grow_array((void **)&(arr), &(cap), (need), sizeof *(arr))

#endif
