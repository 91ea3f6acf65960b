/* Strict UTF-8 (RFC 3629): no overlongs, no surrogates, nothing above U+10FFFF. */
#ifndef CKPT_UTF8_H
#define CKPT_UTF8_H

#include <stdbool.h>
#include <stddef.h>

/* Length of the valid sequence starting at p (1..4), or 0 if it is not valid UTF-8. */
size_t utf8_seq_len(const unsigned char *p, size_t avail);
/* True when all n bytes at s are valid UTF-8. */
bool utf8_valid(const char *s, size_t n);

/* Offset of the first byte of s[0..n) that is not part of a valid sequence, or n. */
size_t utf8_invalid_at(const char *s, size_t n);

/* s[0..n) for a message: '%', control bytes and bytes outside valid UTF-8 as %XX (as the tree
 * escapes names, and a NUL shows instead of ending the text), cut with "..." to fit cap.
 * Returns out. */
char *utf8_shown(char *out, size_t cap, const char *s, size_t n);

#endif
