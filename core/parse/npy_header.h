/* numpy .npy headers (npy_header.c). */
#ifndef CKPT_NPY_HEADER_H
#define CKPT_NPY_HEADER_H

#include "../ckpt.h"

/* The dtype, shape, element order and data offset an .npy header gives. head holds the file's
 * first n bytes (the whole header, or all of a smaller file). Returns 0, or -EINVAL with a
 * message naming the field in why[]. A dtype ckptfs has no dtype for and big-endian data are
 * refused; Fortran order is reported, for the caller to read with strides or refuse. */
typedef struct npy_header {
    ckpt_dtype dtype;
    uint32_t ndim;
    uint64_t shape[CKPT_MAX_DIMS];
    uint64_t data_offset;
    bool fortran_order; /* column-major: the first index varies fastest */
} npy_header;
enum { NPY_MAX_HEADER = 1 << 20 };
int npy_header_parse(const unsigned char *head, size_t n, npy_header *out, char *why,
                     size_t why_cap);

#endif
