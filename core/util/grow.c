#include "grow.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

int grow_array(void **arr, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t n = *cap ? *cap : 16;
    while (n < need) {
        if (n > SIZE_MAX / 2 / elem) return -ENOMEM;
        n *= 2;
    }
    void *p = realloc(*arr, n * elem);
    if (!p) return -ENOMEM;
    *arr = p;
    *cap = n;
    return 0;
}
