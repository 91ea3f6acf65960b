#include "optval.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

bool parse_uint_option(const char *text, unsigned min, unsigned max, unsigned *out) {
    if (!text) return true;
    if (!*text) return false;
    unsigned long long v = 0;
    for (const char *p = text; *p; p++) {
        if (*p < '0' || *p > '9') return false;
        v = v * 10 + (unsigned)(*p - '0');
        if (v > max) return false;
    }
    if (v < min) return false;
    *out = (unsigned)v;
    return true;
}

bool parse_seconds_option(const char *text, double *out) {
    if (!text) return true;
    /* strtod also reads "inf", "nan" and hex floats: only plain decimals are seconds. */
    for (const char *p = text; *p; p++)
        if (!((*p >= '0' && *p <= '9') || *p == '.')) return false;
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end || errno || !isfinite(v) || v < 0) return false;
    *out = v;
    return true;
}
