#include "cpu.h"

#if defined(__x86_64__)
#include <cpuid.h>

enum { F16C = 1, AVX2 = 2, ASKED = 4 };

static int ask(void) {
    unsigned a, b, c, d;
    int has = ASKED;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return has;
    bool avx = c & (1u << 28), osxsave = c & (1u << 27), f16c = c & (1u << 29);
    if (!avx || !osxsave || !f16c) return has;
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 6) != 6) return has; /* the OS does not save xmm and ymm state */
    has |= F16C;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 5))) has |= AVX2;
    return has;
}

static int features(void) {
    static int known; /* written once with the same value by whichever thread asks first */
    int has = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (!has) __atomic_store_n(&known, has = ask(), __ATOMIC_RELAXED);
    return has;
}

bool ckpt_cpu_f16c(void) {
    return features() & F16C;
}

bool ckpt_cpu_f16c_avx2(void) {
    return (features() & (F16C | AVX2)) == (F16C | AVX2);
}
#else
bool ckpt_cpu_f16c(void) {
    return false;
}

bool ckpt_cpu_f16c_avx2(void) {
    return false;
}
#endif
