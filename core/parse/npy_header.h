/* numpy .npy headers (npy_header.c). */
#ifndef CKPT_NPY_HEADER_H
#define CKPT_NPY_HEADER_H

#include "../ckpt.h"

/* The dtype, shape and data offset an .npy header gives. head holds the file's first n bytes
 * (the whole header, or all of a smaller file). Returns 0, or -EINVAL with a message naming
 * the field in why[]. */
typedef struct staged_npy {
    ckpt_dtype dtype;
    uint32_t ndim;
    uint64_t shape[CKPT_MAX_DIMS];
    uint64_t data_offset;
} staged_npy;
enum { STAGED_NPY_MAX_HEADER = 1 << 20 };
int staged_npy_parse(const unsigned char *head, size_t n, staged_npy *out, char *why,
                     size_t why_cap);

#endif
