/* Sizes on the command line (max_shard_size). */
#ifndef CKPTFS_SIZE_H
#define CKPTFS_SIZE_H

#include <stdint.h>

/* "5GB" = 5 * 10^9, "2GiB" = 2 * 2^30, plain bytes; text NULL keeps *out. 0 or -1. */
int parse_size_option(const char *text, uint64_t *out);

#endif
