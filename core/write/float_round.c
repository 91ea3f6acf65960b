/* Float rounding on bits: a double to any binary float format, a float's bits to F32, BF16 or
 * F16, to nearest with ties to even, as numpy's astype does (float_round.h). */
#include "float_round.h"

#include "../util/cpu.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

uint32_t ckpt_round_float(double x, int mbits, int ebits) {
    uint64_t b;
    memcpy(&b, &x, sizeof b);
    uint32_t sign = (uint32_t)(b >> 63) << (mbits + ebits);
    uint32_t exp_all = (1u << ebits) - 1, inf = sign | exp_all << mbits;
    if (isnan(x)) {
        uint32_t payload = (uint32_t)((b & ((1ull << 52) - 1)) >> (52 - mbits));
        return inf | 1u << (mbits - 1) | payload;
    }
    if (isinf(x)) return inf;
    double a = fabs(x);
    if (a == 0) return sign;
    int e;
    frexp(a, &e);
    int bias = (1 << (ebits - 1)) - 1, E = e - 1, emin = 1 - bias;
    /* The value as an integer count of the target's quantum at this magnitude: the scaling is
     * by a power of two, exact, and nearbyint rounds ties to even in the default mode. */
    int quantum = (E < emin ? emin : E) - mbits;
    uint64_t m = (uint64_t)nearbyint(ldexp(a, -quantum));
    if (E < emin) return sign | (uint32_t)m; /* subnormal; 2^mbits carries into the exponent */
    if (m == 1ull << (mbits + 1)) {
        m >>= 1;
        E++;
    }
    if (E + bias >= (int)exp_all) return inf;
    return sign | (uint32_t)(E + bias) << mbits | (uint32_t)(m - (1ull << mbits));
}

/* The float conversions below give what ckpt_round_float gives for a float's value (an
 * exhaustive comparison over all 2^32 patterns is in tests/unit/cast.c), on its bits: the
 * general routine goes through frexp/ldexp/nearbyint, ~17 ns a value. */
uint32_t ckpt_f32_to_f32(uint32_t u) {
    return (u & 0x7FFFFFFFu) > 0x7F800000u ? u | 0x400000u : u; /* NaN: quiet */
}

uint16_t ckpt_f32_to_bf16(uint32_t u) {
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)(u >> 16 | 0x40); /* NaN: quiet */
    return (uint16_t)((u + 0x7FFFu + (u >> 16 & 1)) >> 16); /* ties to even; may carry to inf */
}

uint16_t ckpt_f32_to_f16(uint32_t u) {
    uint16_t sign = (uint16_t)(u >> 16 & 0x8000);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return sign | 0x7E00 | (uint16_t)(a >> 13 & 0x3FF); /* NaN: quiet */
    if (a >= 0x477FF000u) return sign | 0x7C00; /* 65520 and up: the tie above 65504 is odd */
    if (a >= 0x38800000u) {                     /* normal in F16: rebias, round off 13 bits */
        a += 0xFFFu + (a >> 13 & 1);
        return sign | (uint16_t)((a - 0x38000000u) >> 13);
    }
    if (a <= 0x33000000u) return sign; /* at most half the least subnormal (2^-25): to zero */
    /* subnormal in F16: the value in units of 2^-24 is m * 2^(e - 126), e <= 112 */
    uint32_t e = a >> 23, m = (a & 0x7FFFFFu) | 0x800000u, shift = 126 - e;
    uint32_t q = m >> shift, rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (q & 1))) q++;
    return sign | (uint16_t)q; /* q may reach 0x400: the least normal, encoded alike */
}

#if defined(__x86_64__)
#include <immintrin.h>

/* The CPU's own conversion: IEEE round to nearest even with subnormals (MXCSR's DAZ/FTZ are
 * never set here), NaN quieted with its leading payload bits, as ckpt_f32_to_f16 does:
 * tests/unit/cast.c compares the two. ~7 ns a value in C, a fraction of that here. */
__attribute__((target("avx,f16c"))) static void f16_by_f16c(const float *in, size_t n,
                                                            uint16_t *out) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(out + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) {
        uint32_t u;
        memcpy(&u, &in[i], 4);
        out[i] = ckpt_f32_to_f16(u);
    }
}
#endif

void ckpt_f32_to_f16_many(const float *in, size_t n, uint16_t *out) {
#if defined(__x86_64__)
    if (ckpt_cpu_f16c()) {
        f16_by_f16c(in, n, out);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &in[i], 4);
        out[i] = ckpt_f32_to_f16(u);
    }
}
