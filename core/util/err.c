#include "err.h"
#include "../ckpt.h"
#include "text.h"

#include <stdarg.h>
#include <stdio.h>

int ckpt_fail(ckpt_err *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        /* The message is printed as one line: no embedded newlines from names or JSON. */
        for (char *p = err->msg; *p; p++)
            if ((unsigned char)*p < 0x20) *p = ' ';
    }
    return code;
}

enum { SHOWN_MAX = 120, SHOWN_RING = 8 };

const char *ckpt_shown(const char *name, size_t len) {
    static _Thread_local char ring[SHOWN_RING][SHOWN_MAX * 3 + 4];
    static _Thread_local unsigned next;
    char *out = ring[next++ % SHOWN_RING], *o = out;
    size_t n = len > SHOWN_MAX ? SHOWN_MAX : len;
    o += text_pct_escape_buf(out, name ? name : "", name ? n : 0, false);
    if (len > n) o += sprintf(o, "...");
    *o = '\0';
    return out;
}
