#include "strbuf.h"

#include "utf8.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sb_init(strbuf *sb) {
    sb->data = NULL;
    sb->len = sb->cap = 0;
    sb->failed = false;
}

void sb_free(strbuf *sb) {
    free(sb->data);
    sb_init(sb);
}

char *sb_take(strbuf *sb, size_t *len) {
    if (sb->failed || !sb_reserve(sb, 1)) {
        sb_free(sb);
        return NULL;
    }
    sb->data[sb->len] = '\0';
    char *p = sb->data;
    if (len) *len = sb->len;
    sb_init(sb);
    return p;
}

void sb_clear(strbuf *sb) {
    sb->len = 0;
    sb->failed = false;
    if (sb->data) sb->data[0] = '\0';
}

bool sb_reserve(strbuf *sb, size_t extra) {
    if (sb->failed) return false;
    if (sb->cap - sb->len > extra) return true;
    size_t cap = sb->cap ? sb->cap : 256;
    while (cap - sb->len <= extra) {
        if (cap > SIZE_MAX / 2) {
            sb->failed = true;
            return false;
        }
        cap *= 2;
    }
    char *p = realloc(sb->data, cap);
    if (!p) {
        sb->failed = true;
        return false;
    }
    sb->data = p;
    sb->cap = cap;
    return true;
}

/* data[len] is always NUL once anything was written, so data can be used as a C string. */
void sb_put(strbuf *sb, const void *p, size_t n) {
    if (!n || !sb_reserve(sb, n)) return;
    memcpy(sb->data + sb->len, p, n);
    sb->len += n;
    sb->data[sb->len] = '\0';
}

void sb_puts(strbuf *sb, const char *s) {
    sb_put(sb, s, strlen(s));
}

void sb_putc(strbuf *sb, char c) {
    if (!sb_reserve(sb, 1)) return;
    sb->data[sb->len++] = c;
    sb->data[sb->len] = '\0';
}

void sb_u64(strbuf *sb, uint64_t v) {
    /* By hand: headers of 100k tensors format a million numbers, and snprintf costs ~10x. */
    char tmp[20];
    size_t n = sizeof tmp;
    do {
        tmp[--n] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    sb_put(sb, tmp + n, sizeof tmp - n);
}

void sb_printf(strbuf *sb, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !sb_reserve(sb, (size_t)n + 1)) return;
    va_start(ap, fmt);
    vsnprintf(sb->data + sb->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb->len += (size_t)n;
}

void sb_json_str(strbuf *sb, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    sb_putc(sb, '"');
    size_t i = 0;
    while (i < n) {
        /* Plain ASCII runs are copied at once; names are almost all plain. */
        size_t run = i;
        while (run < n) {
            unsigned char c = (unsigned char)s[run];
            if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\') break;
            run++;
        }
        if (run > i) {
            sb_put(sb, s + i, run - i);
            i = run;
            continue;
        }
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x80) {
            size_t k = utf8_seq_len((const unsigned char *)s + i, n - i);
            if (k)
                sb_put(sb, s + i, k);
            else
                sb_puts(sb, "\\ufffd");
            i += k ? k : 1;
            continue;
        }
        if (c == '"' || c == '\\') {
            sb_putc(sb, '\\');
            sb_putc(sb, (char)c);
        } else if (c == '\n') {
            sb_puts(sb, "\\n");
        } else if (c == '\t') {
            sb_puts(sb, "\\t");
        } else {
            char esc[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            sb_put(sb, esc, sizeof esc);
        }
        i++;
    }
    sb_putc(sb, '"');
}
