/* Numbers in -o option values, parsed strictly: fuse_opt's %u takes "-1" as 4294967295 and
 * "4x" as 4, and %lf takes "nan"; a value that is not what the option means is refused. */
#ifndef CKPTFS_OPTVAL_H
#define CKPTFS_OPTVAL_H

#include <stdbool.h>

/* Decimal digits only, min <= value <= max. text NULL keeps *out. */
bool parse_uint_option(const char *text, unsigned min, unsigned max, unsigned *out);
/* A finite number of seconds >= 0 (decimal, fractions allowed). text NULL keeps *out. */
bool parse_seconds_option(const char *text, double *out);

#endif
