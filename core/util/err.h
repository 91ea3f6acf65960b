/* Names and text in error messages (err.c). */
#ifndef CKPT_ERR_H
#define CKPT_ERR_H

#include <stddef.h>

/* Text in messages that is not a name: at most 120 bytes, used as "%.*s", SHOWN(len), text. */
#define SHOWN(len) ((int)((len) > 120 ? 120 : (len)))
/* Names in messages, used as "%.*s", SHOWN_NAME(name, len): escaped as the tree escapes a
 * path component (%XX for bytes 0x00-0x1F, 0x7F and '%'), so a name holding a NUL is shown
 * whole and not as the different name its first bytes spell; cut after 120 bytes with "...".
 * The text lives in one of 8 buffers of the calling thread, reused in turn. */
#define SHOWN_NAME(name, len) -1, ckpt_shown((name), (len))
const char *ckpt_shown(const char *name, size_t len);

#endif
