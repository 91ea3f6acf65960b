#include "message.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

enum { MSG_MAX = 2048 };

size_t msg_sanitize(char *out, size_t cap, const char *text, size_t len) {
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        /* U+0080-U+009F in UTF-8 (C2 80-9F): 0x9B alone is CSI on terminals that take C1. */
        bool c1 = c == 0xC2 && i + 1 < len && (unsigned char)text[i + 1] >= 0x80 &&
                  (unsigned char)text[i + 1] <= 0x9F;
        bool escape = c < 0x20 || c == 0x7F || (c >= 0x80 && c <= 0x9F);
        if (c1) {
            if (o + 6 >= cap) break;
            unsigned char d = (unsigned char)text[++i];
            out[o++] = '%', out[o++] = 'C', out[o++] = '2';
            out[o++] = '%', out[o++] = hex[d >> 4], out[o++] = hex[d & 15];
        } else if (escape) {
            if (o + 3 >= cap) break;
            out[o++] = '%', out[o++] = hex[c >> 4], out[o++] = hex[c & 15];
        } else {
            if (o + 1 >= cap) break;
            out[o++] = (char)c;
        }
    }
    out[o] = '\0';
    return o;
}

void msg_verror(const char *cmd, const char *fmt, va_list ap) {
    char raw[MSG_MAX], line[MSG_MAX * 3 + 64];
    int n = vsnprintf(raw, sizeof raw, fmt, ap);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof raw ? (size_t)n : sizeof raw - 1;
    int head = snprintf(line, sizeof line, "ckptfs%s%s: ", cmd ? " " : "", cmd ? cmd : "");
    size_t o = (size_t)head;
    o += msg_sanitize(line + o, sizeof line - o - 5, raw, len);
    if ((size_t)n >= sizeof raw) o += (size_t)snprintf(line + o, sizeof line - o, "...");
    line[o++] = '\n';
    /* One write, so messages of threads (serve, a stage) do not interleave mid-line. */
    fwrite(line, 1, o, stderr);
}

void msg_print_lines(FILE *to, const char *text) {
    char line[MSG_MAX * 3 + 2];
    while (text && *text) {
        size_t n = strcspn(text, "\n"), done = 0;
        do { /* a long line in pieces of MSG_MAX bytes, the newline after the last */
            size_t take = n - done > MSG_MAX ? MSG_MAX : n - done;
            size_t o = msg_sanitize(line, sizeof line - 1, text + done, take);
            done += take;
            if (done == n) line[o++] = '\n';
            fwrite(line, 1, o, to);
        } while (done < n);
        text += n + (text[n] == '\n');
    }
}

void msg_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    msg_verror(cmd, fmt, ap);
    va_end(ap);
}
