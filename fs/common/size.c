#include "size.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Sizes as huggingface_hub writes them: "5GB" = 5 * 10^9, "2GiB" = 2 * 2^30; NULL keeps *out.
 * Plain decimal numbers only (no sign, hex, exponent, NaN), and not zero. */
int parse_size_option(const char *text, uint64_t *out) {
    if (!text) return 0;
    const char *p = text;
    while ((*p >= '0' && *p <= '9') || *p == '.') p++;
    if (p == text || !(text[0] >= '0' && text[0] <= '9')) return -1;
    char *end;
    double v = strtod(text, &end);
    if (end != p || !(v > 0)) return -1;
    static const struct {
        const char *unit;
        double scale;
    } units[] = {{"", 1},
                 {"B", 1},
                 {"KB", 1e3},
                 {"MB", 1e6},
                 {"GB", 1e9},
                 {"TB", 1e12},
                 {"KiB", 1024.0},
                 {"MiB", 1048576.0},
                 {"GiB", 1073741824.0},
                 {"TiB", 1099511627776.0},
                 {"K", 1e3},
                 {"M", 1e6},
                 {"G", 1e9}};
    for (size_t i = 0; i < sizeof units / sizeof *units; i++) {
        if (strcasecmp(end, units[i].unit) == 0) {
            double bytes = v * units[i].scale;
            if (!(bytes >= 1) || bytes >= 18446744073709551615.0) return -1;
            *out = (uint64_t)bytes;
            return 0;
        }
    }
    return -1;
}
