/* Small text helpers shared by core and fs: suffixes, and the %XX escapes with which tree paths,
 * tensors.tsv, names on the command line and the stage journal show arbitrary bytes. */
#ifndef CKPT_TEXT_H
#define CKPT_TEXT_H

#include "strbuf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

bool text_ends_with(const char *s, const char *suffix);
/* The same for n bytes at s, which may hold NULs. */
bool text_mem_ends_with(const void *s, size_t n, const char *suffix);

/* "4, 2" for messages: n numbers, cut short with ", ..." when they do not fit in size bytes
 * (size > 24). Returns buf. */
const char *text_dims(char *buf, size_t size, const uint64_t *v, uint32_t n);

/* 0..15 for a hex digit (either case), -1 otherwise. */
int text_hex_digit(char c);

/* Appends n bytes of s with control bytes, 0x7F and '%' as %XX (upper-case hex); with `space`,
 * ' ' too (fields separated by spaces). */
void text_pct_escape(strbuf *sb, const char *s, size_t n, bool space);
/* text_pct_escape into out, which holds 3 * n + 1 bytes; returns the length written
 * (NUL-terminated). */
size_t text_pct_escape_buf(char *out, const char *s, size_t n, bool space);
/* Undoes text_pct_escape in place on the NUL-terminated s and NUL-terminates the result; *len gets
 * its length (it may hold NULs). A '%' not followed by two hex digits is kept as it is, or with
 * `strict` makes this return false. */
bool text_pct_unescape(char *s, size_t *len, bool strict);

#endif
