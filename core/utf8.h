/* Strict UTF-8 (RFC 3629): no overlongs, no surrogates, nothing above U+10FFFF. */
#ifndef CKPT_UTF8_H
#define CKPT_UTF8_H

#include <stddef.h>

/* Length of the valid sequence starting at p (1..4), or 0 if it is not valid UTF-8. */
size_t utf8_seq_len(const unsigned char *p, size_t avail);

#endif
