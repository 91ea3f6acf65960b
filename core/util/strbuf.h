/* Growable byte buffer for generated documents (sidecars, summaries, headers). */
#ifndef CKPT_STRBUF_H
#define CKPT_STRBUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct strbuf {
    char *data; /* NUL-terminated once anything was written */
    size_t len;
    size_t cap;
    bool failed; /* sticky: set on allocation failure, so callers check once at the end */
} strbuf;

void sb_init(strbuf *sb);
void sb_free(strbuf *sb);
/* Hands the buffer to the caller (NUL-terminated); the strbuf is reset. NULL if it failed. */
char *sb_take(strbuf *sb, size_t *len);
void sb_clear(strbuf *sb);
bool sb_reserve(strbuf *sb, size_t extra);
void sb_put(strbuf *sb, const void *p, size_t n);
void sb_puts(strbuf *sb, const char *s);
void sb_putc(strbuf *sb, char c);
void sb_u64(strbuf *sb, uint64_t v);
void sb_printf(strbuf *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* JSON string literal with quotes; bytes that are not valid UTF-8 become U+FFFD. */
void sb_json_str(strbuf *sb, const char *s, size_t n);

#endif
