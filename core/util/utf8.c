#include "utf8.h"

#include <stdbool.h>
#include <string.h>

size_t utf8_seq_len(const unsigned char *p, size_t avail) {
    if (avail == 0) return 0;
    unsigned char c = p[0];
    if (c < 0x80) return 1;
    size_t n;
    unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0)
            lo = 0xA0; /* overlong */
        else if (c == 0xED)
            hi = 0x9F; /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0)
            lo = 0x90; /* overlong */
        else if (c == 0xF4)
            hi = 0x8F; /* above U+10FFFF */
    } else {
        return 0;
    }
    if (avail < n) return 0;
    if (p[1] < lo || p[1] > hi) return 0;
    for (size_t i = 2; i < n; i++)
        if ((p[i] & 0xC0) != 0x80) return 0;
    return n;
}

size_t utf8_invalid_at(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq_len((const unsigned char *)s + i, n - i);
        if (k == 0) return i;
        i += k;
    }
    return n;
}

char *utf8_shown(char *out, size_t cap, const char *s, size_t n) {
    static const char hex[] = "0123456789ABCDEF";
    if (cap < 8) {
        if (cap) out[0] = '\0';
        return out;
    }
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq_len((const unsigned char *)s + i, n - i);
        unsigned char c = (unsigned char)s[i];
        bool escape = k == 0 || c < 0x20 || c == 0x7f || c == '%';
        size_t need = escape ? 3 : k;
        if (o + need + 4 > cap) { /* room for "..." and the NUL */
            memcpy(out + o, "...", 3);
            o += 3;
            break;
        }
        if (escape) {
            out[o++] = '%';
            out[o++] = hex[c >> 4];
            out[o++] = hex[c & 15];
            i++;
        } else {
            memcpy(out + o, s + i, k);
            o += k;
            i += k;
        }
    }
    out[o < cap ? o : cap - 1] = '\0';
    return out;
}

bool utf8_valid(const char *s, size_t n) {
    return utf8_invalid_at(s, n) == n;
}
