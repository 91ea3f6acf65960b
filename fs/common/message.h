/* Messages on stderr for every front end: "ckptfs CMD: text", one line whatever the text holds.
 * A path, a tensor name or a server's answer may hold a newline or an escape sequence; printed
 * raw it could forge a second message or drive the terminal. Like core's ckpt_shown, bytes
 * 0x00-0x1F and 0x7F (and the C1 controls U+0080-U+009F) are shown as %XX. */
#ifndef CKPTFS_MESSAGE_H
#define CKPTFS_MESSAGE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

/* cmd: "stage", "serve", ... or NULL for the mount ("ckptfs: text"). */
void msg_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void msg_verror(const char *cmd, const char *fmt, va_list ap);
/* A multi-line report (a commit's list of problems) on to: each line shown as msg_error shows
 * its text, each ended by a newline. */
void msg_print_lines(FILE *to, const char *text);
/* The shown form of text[0..len) into out (cap >= 1; cut to fit, never mid-escape). Returns
 * the length written. */
size_t msg_sanitize(char *out, size_t cap, const char *text, size_t len);

#endif
