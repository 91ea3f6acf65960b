/* Numbers for people: byte sizes in powers of 1024 ("1.5 GiB"), parameter counts in powers of
 * 1000 as model cards write them ("6.7B", "124M"), digit grouping. */
#include "human.h"

#include <stdio.h>

void human_size(uint64_t bytes, char *out, size_t cap) {
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (bytes < 1024) {
        snprintf(out, cap, "%llu B", (unsigned long long)bytes);
        return;
    }
    double v = (double)bytes / 1024;
    size_t k = 0;
    /* 1023.95 would print as "1024.0": move to the next unit instead. */
    while (v >= 1023.95 && k + 1 < sizeof units / sizeof *units) {
        v /= 1024;
        k++;
    }
    snprintf(out, cap, "%.1f %s", v, units[k]);
}

void human_count(uint64_t n, char *out, size_t cap) {
    static const char suffix[] = "KMBT";
    double v = (double)n;
    int k = 0;
    while (k < 4 && v >= 999.5) { /* 999.5 rounds to "1000": the next unit reads better */
        v /= 1000;
        k++;
    }
    if (k == 0)
        snprintf(out, cap, "%llu", (unsigned long long)n);
    else
        snprintf(out, cap, v < 9.95 ? "%.1f%c" : "%.0f%c", v, suffix[k - 1]);
}

void human_grouped(uint64_t n, char *out, size_t cap) {
    char digits[24];
    int len = snprintf(digits, sizeof digits, "%llu", (unsigned long long)n);
    size_t k = 0;
    for (int i = 0; i < len && k + 1 < cap; i++) {
        if (i && (len - i) % 3 == 0) {
            if (k + 2 >= cap) break;
            out[k++] = ',';
        }
        out[k++] = digits[i];
    }
    if (cap) out[k] = '\0';
}
