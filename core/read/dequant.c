/* Conversion to float32 on read (-o as_dtype=f32): half and bfloat16, the two float8 formats
 * torch and safetensors use, and the ggml block types gguf-py writes (Q4_0, Q4_1, Q5_0, Q5_1,
 * Q8_0, TQ1_0, TQ2_0, MXFP4) with Q4_K and Q6_K. Block layouts and the order of
 * the arithmetic follow ggml's reference dequantizers, so results are bit-exact with them. */
#include "dequant.h"
#include "../util/cpu.h"
#include "../util/le.h"

#include <math.h>
#include <string.h>

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float ckpt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | man << 13); /* inf, NaN */
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24, exact in float */
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    return bits_f32(sign | (exp + 112) << 23 | man << 13);
}

static float bf16_to_f32(uint16_t b) {
    return bits_f32((uint32_t)b << 16);
}

/* float8_e4m3fn: bias 7, no infinities, S.1111.111 is NaN. */
static float e4m3_to_f32(uint8_t b) {
    uint32_t exp = (b >> 3) & 0xf, man = b & 7;
    float v;
    if (exp == 0xf && man == 7)
        v = NAN;
    else if (exp == 0)
        v = (float)man * 0x1p-9f; /* subnormal: man/8 * 2^-6 */
    else
        v = ldexpf(1.0f + (float)man / 8.0f, (int)exp - 7);
    return (b & 0x80) ? -v : v;
}

/* float8_e5m2 is the top byte of a half. */
static float e5m2_to_f32(uint8_t b) {
    return ckpt_f16_to_f32((uint16_t)(b << 8));
}

static void q8_0(const unsigned char *b, float *y) { /* f16 d; int8 q[32] */
    float d = ckpt_f16_to_f32(le16(b));
    for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
}

static void q4_0(const unsigned char *b, float *y) { /* f16 d; 16 bytes of nibble pairs */
    float d = ckpt_f16_to_f32(le16(b));
    const unsigned char *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((qs[j] & 0x0f) - 8) * d;
        y[j + 16] = (float)((qs[j] >> 4) - 8) * d;
    }
}

static void q4_1(const unsigned char *b, float *y) { /* f16 d, f16 m; 16 bytes of nibbles */
    float d = ckpt_f16_to_f32(le16(b)), m = ckpt_f16_to_f32(le16(b + 2));
    const unsigned char *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)(qs[j] & 0x0f) * d + m;
        y[j + 16] = (float)(qs[j] >> 4) * d + m;
    }
}

/* Q5_0 and Q5_1: the fifth bit of element j is bit j of the little-endian uint32 qh. */
static void q5_0(const unsigned char *b, float *y) { /* f16 d; qh[4]; qs[16] */
    float d = ckpt_f16_to_f32(le16(b));
    uint32_t qh = le32(b + 2);
    const unsigned char *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        int x0 = (int)((qs[j] & 0x0f) | (((qh >> j) << 4) & 0x10)) - 16;
        int x1 = (int)((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16;
        y[j] = (float)x0 * d;
        y[j + 16] = (float)x1 * d;
    }
}

static void q5_1(const unsigned char *b, float *y) { /* f16 d, f16 m; qh[4]; qs[16] */
    float d = ckpt_f16_to_f32(le16(b)), m = ckpt_f16_to_f32(le16(b + 2));
    uint32_t qh = le32(b + 4);
    const unsigned char *qs = b + 8;
    for (int j = 0; j < 16; j++) {
        unsigned x0 = (qs[j] & 0x0f) | (((qh >> j) << 4) & 0x10);
        unsigned x1 = (qs[j] >> 4) | ((qh >> (j + 12)) & 0x10);
        y[j] = (float)x0 * d + m;
        y[j + 16] = (float)x1 * d + m;
    }
}

/* MXFP4: an E8M0 exponent e, then 16 bytes of E2M1 nibbles. The table holds the E2M1 values
 * doubled, so the scale is half of 2^(e-127) (ggml's GGML_E8M0_TO_FP32_HALF: for e < 2 the
 * half is a subnormal). */
static void mxfp4(const unsigned char *b, float *y) {
    static const int8_t kvalues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    uint8_t e = b[0];
    float d = bits_f32(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
    const unsigned char *qs = b + 1;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)kvalues[qs[j] & 0x0f] * d;
        y[j + 16] = (float)kvalues[qs[j] >> 4] * d;
    }
}

/* One ternary digit of TQ1_0: digit n of byte q is the top of (q * 3^n mod 256) * 3 / 256,
 * minus 1 (base-3 fixed point). */
static float tq1_digit(uint8_t q, uint8_t pow3, float d) {
    return (float)((((uint8_t)(q * pow3)) * 3 >> 8) - 1) * d;
}

/* TQ1_0: 48 bytes each holding 5 ternary digits, then 4 bytes holding 4, then f16 d. Element
 * order: the first 32 bytes for each power, then the next 16, then qh. */
static void tq1_0(const unsigned char *b, float *y) {
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    const unsigned char *qs = b, *qh = b + 48;
    float d = ckpt_f16_to_f32(le16(b + 52));
    for (int n = 0; n < 5; n++)
        for (int m = 0; m < 32; m++) *y++ = tq1_digit(qs[m], pow3[n], d);
    for (int n = 0; n < 5; n++)
        for (int m = 0; m < 16; m++) *y++ = tq1_digit(qs[32 + m], pow3[n], d);
    for (int n = 0; n < 4; n++)
        for (int m = 0; m < 4; m++) *y++ = tq1_digit(qh[m], pow3[n], d);
}

/* TQ2_0: 64 bytes of four 2-bit digits (value digit - 1), then f16 d. */
static void tq2_0(const unsigned char *b, float *y) {
    float d = ckpt_f16_to_f32(le16(b + 64));
    for (int j = 0; j < 64; j += 32)
        for (int l = 0; l < 4; l++)
            for (int m = 0; m < 32; m++) *y++ = (float)(((b[j + m] >> (l * 2)) & 3) - 1) * d;
}

/* Q4_K: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins for 8 sub-blocks, 128 bytes. */
static void scale_min_k4(int j, const unsigned char *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static void q4_k(const unsigned char *b, float *y) {
    float d = ckpt_f16_to_f32(le16(b)), min = ckpt_f16_to_f32(le16(b + 2));
    const unsigned char *scales = b + 4, *q = b + 16;
    for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
        uint8_t sc, m;
        scale_min_k4(is, scales, &sc, &m);
        float d1 = d * sc, m1 = min * m;
        scale_min_k4(is + 1, scales, &sc, &m);
        float d2 = d * sc, m2 = min * m;
        for (int l = 0; l < 32; l++) y[j + l] = d1 * (float)(q[l] & 0xf) - m1;
        for (int l = 0; l < 32; l++) y[j + 32 + l] = d2 * (float)(q[l] >> 4) - m2;
    }
}

/* Q6_K: ql[128] low nibbles, qh[64] high 2 bits, int8 scales[16], f16 d. */
static void q6_k(const unsigned char *b, float *y) {
    const unsigned char *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = ckpt_f16_to_f32(le16(b + 208));
    for (int n = 0; n < 256; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = (int)((ql[l] & 0xf) | ((qh[l] >> 0) & 3) << 4) - 32;
            int q2 = (int)((ql[l + 32] & 0xf) | ((qh[l] >> 2) & 3) << 4) - 32;
            int q3 = (int)((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
            int q4 = (int)((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
            y[l] = d * (float)sc[is] * (float)q1;
            y[l + 32] = d * (float)sc[is + 2] * (float)q2;
            y[l + 64] = d * (float)sc[is + 4] * (float)q3;
            y[l + 96] = d * (float)sc[is + 6] * (float)q4;
        }
    }
}

bool ckpt_to_f32_supported(ckpt_dtype dt) {
    switch (dt) {
    case CKPT_F16:
    case CKPT_BF16:
    case CKPT_F8_E4M3:
    case CKPT_F8_E5M2:
    case CKPT_Q8_0:
    case CKPT_Q4_0:
    case CKPT_Q4_1:
    case CKPT_Q5_0:
    case CKPT_Q5_1:
    case CKPT_Q4_K:
    case CKPT_Q6_K:
    case CKPT_TQ1_0:
    case CKPT_TQ2_0:
    case CKPT_MXFP4:
        return true;
    default:
        return false;
    }
}

#if defined(__x86_64__)
#include <immintrin.h>

/* The CPU's conversion is exact for every half but a signaling NaN, which it quiets: NaN lanes
 * take the bits ckpt_f16_to_f32 gives (sign and payload as they are, as numpy keeps them),
 * made in the same registers: calling the scalar code for them instead mixed SSE into AVX
 * code, ~30 ns an element on random halves. tests/unit/dequant.c compares all 65,536. */
__attribute__((target("avx2,f16c"))) static void f16_by_f16c(const unsigned char *src, size_t n,
                                                             float *dst) {
    const __m256i exp = _mm256_set1_epi32(0x7c00), man = _mm256_set1_epi32(0x03ff);
    const __m256i sign = _mm256_set1_epi32(0x8000), inf = _mm256_set1_epi32(0x7f800000);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(src + 2 * i));
        __m256i w = _mm256_cvtepu16_epi32(h);
        __m256i m = _mm256_and_si256(w, man);
        __m256i is_nan = _mm256_andnot_si256(_mm256_cmpeq_epi32(m, _mm256_setzero_si256()),
                                             _mm256_cmpeq_epi32(_mm256_and_si256(w, exp), exp));
        __m256i nan_bits =
            _mm256_or_si256(_mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(w, sign), 16), inf),
                            _mm256_slli_epi32(m, 13));
        __m256 f = _mm256_blendv_ps(_mm256_cvtph_ps(h), _mm256_castsi256_ps(nan_bits),
                                    _mm256_castsi256_ps(is_nan));
        _mm256_storeu_ps(dst + i, f);
    }
    _mm256_zeroupper();
    for (; i < n; i++) dst[i] = ckpt_f16_to_f32(le16(src + 2 * i));
}
#endif

static void f16_to_f32_many(const unsigned char *src, size_t n, float *dst) {
#if defined(__x86_64__)
    if (ckpt_cpu_f16c_avx2()) {
        f16_by_f16c(src, n, dst);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) dst[i] = ckpt_f16_to_f32(le16(src + 2 * i));
}

/* One loop per dtype: a switch per element cost more than the conversion. */
void ckpt_to_f32(ckpt_dtype dt, const unsigned char *src, size_t nblocks, float *dst) {
    const ckpt_dtype_info *info = ckpt_dtype_info_of(dt);
    switch (dt) {
    case CKPT_F16:
        f16_to_f32_many(src, nblocks, dst);
        return;
    case CKPT_BF16:
        for (size_t i = 0; i < nblocks; i++) dst[i] = bf16_to_f32(le16(src + 2 * i));
        return;
    case CKPT_F8_E4M3:
        for (size_t i = 0; i < nblocks; i++) dst[i] = e4m3_to_f32(src[i]);
        return;
    case CKPT_F8_E5M2:
        for (size_t i = 0; i < nblocks; i++) dst[i] = e5m2_to_f32(src[i]);
        return;
    default:
        break;
    }
    void (*block)(const unsigned char *, float *) = NULL;
    switch (dt) {
    case CKPT_Q8_0:
        block = q8_0;
        break;
    case CKPT_Q4_0:
        block = q4_0;
        break;
    case CKPT_Q4_1:
        block = q4_1;
        break;
    case CKPT_Q5_0:
        block = q5_0;
        break;
    case CKPT_Q5_1:
        block = q5_1;
        break;
    case CKPT_Q4_K:
        block = q4_k;
        break;
    case CKPT_Q6_K:
        block = q6_k;
        break;
    case CKPT_TQ1_0:
        block = tq1_0;
        break;
    case CKPT_TQ2_0:
        block = tq2_0;
        break;
    case CKPT_MXFP4:
        block = mxfp4;
        break;
    default:
        break;
    }
    for (size_t i = 0; i < nblocks; i++) {
        float *y = dst + i * info->block;
        if (block)
            block(src + i * info->block_bytes, y);
        else
            memset(y, 0, info->block * sizeof *y);
    }
}
