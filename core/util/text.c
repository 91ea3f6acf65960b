#include "text.h"

#include <stdio.h>
#include <string.h>

bool text_mem_ends_with(const void *s, size_t n, const char *suffix) {
    size_t m = strlen(suffix);
    return n >= m && memcmp((const char *)s + n - m, suffix, m) == 0;
}

bool text_ends_with(const char *s, const char *suffix) {
    return text_mem_ends_with(s, strlen(s), suffix);
}

const char *text_dims(char *buf, size_t size, const uint64_t *v, uint32_t n) {
    size_t at = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < n && at + 24 < size; i++)
        at += (size_t)snprintf(buf + at, size - at, "%s%llu", i ? ", " : "",
                               (unsigned long long)v[i]);
    if (n && at + 24 >= size) snprintf(buf + at, size - at, ", ...");
    return buf;
}

int text_hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

void text_pct_escape(strbuf *sb, const char *s, size_t n, bool space) {
    static const char hex[] = "0123456789ABCDEF"; /* runs of plain bytes go out at once */
    size_t run = 0;                               /* bytes kept as they are go out in runs */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!(c < 0x20 || c == 0x7f || c == '%' || (space && c == ' '))) continue;
        sb_put(sb, s + run, i - run);
        char e[3] = {'%', hex[c >> 4], hex[c & 15]};
        sb_put(sb, e, 3);
        run = i + 1;
    }
    sb_put(sb, s + run, n - run);
}

size_t text_pct_escape_buf(char *out, const char *s, size_t n, bool space) {
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f || c == '%' || (space && c == ' ')) {
            out[o++] = '%';
            out[o++] = hex[c >> 4];
            out[o++] = hex[c & 15];
        } else {
            out[o++] = (char)c;
        }
    }
    out[o] = '\0';
    return o;
}

bool text_pct_unescape(char *s, size_t *len, bool strict) {
    size_t k = 0;
    for (size_t i = 0; s[i]; i++) {
        int hi =
            s[i] == '%' ? text_hex_digit(s[i + 1]) : -1; /* s[i + 1] may be the NUL: no digit */
        int lo = hi >= 0 ? text_hex_digit(s[i + 2]) : -1;
        if (lo >= 0) {
            s[k++] = (char)(hi << 4 | lo);
            i += 2;
        } else if (s[i] == '%' && strict) {
            return false;
        } else {
            s[k++] = s[i];
        }
    }
    s[k] = '\0';
    *len = k;
    return true;
}
