#include "ckpt.h"

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
