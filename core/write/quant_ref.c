/* Q8_0 and Q4_0 blocks as ggml's reference code makes them (quant_ref.h).
 *
 *   Q8_0, 34 bytes per 32 values: d = max|x| / 127 as F16, then 32 int8 q = round(x / d),
 *        rounded half away from zero (roundf), computed as x * (1/d) in float32.
 *   Q4_0, 18 bytes per 32 values: m = the value of largest magnitude (the first such), d = m /
 *        -8 as F16, then q = min(15, trunc(x * (1/d) + 8.5)) for each value, packed two to a
 *        byte: byte j holds value j in its low nibble and value j + 16 in its high one.
 *
 * d is rounded to F16 only when stored: the q are computed with the float32 d, as the
 * reference does (and gguf-py mirrors). Every step is a float32 operation, so the C compiler
 * (no fast-math, SSE float arithmetic) gives numpy's results exactly. */
#include "quant_ref.h"

#include "float_round.h"

#include <math.h>
#include <string.h>

enum { QK = 32 };

bool quant_ref_supported(ckpt_dtype to) {
    return to == CKPT_Q8_0 || to == CKPT_Q4_0;
}

static void put_f16(unsigned char *p, float d) {
    uint32_t u;
    memcpy(&u, &d, 4);
    uint16_t h = ckpt_f32_to_f16(u);
    p[0] = (unsigned char)(h & 0xFF);
    p[1] = (unsigned char)(h >> 8);
}

/* A scaled value as the integer the reference stores. Finite ones are in range (|x * id| <=
 * 127 and x * id + 8.5 in [0, 16.5] up to rounding); a scale whose inverse overflows (|d| below
 * 2^-128) makes them infinite or NaN, which C leaves undefined and numpy (gguf-py) turns into 0
 * on x86: so do we, on every machine. */
static int8_t to_int8(float v) {
    if (!isfinite(v)) return 0;
    return (int8_t)(v > 127 ? 127 : v < -128 ? -128 : v);
}

static unsigned to_nibble(float v) {
    if (!isfinite(v) || v < 0) return 0;
    return v > 15 ? 15 : (unsigned)v;
}

static void block_q8_0(const float *x, unsigned char *out) {
    float amax = 0;
    for (int i = 0; i < QK; i++) {
        float a = fabsf(x[i]);
        if (a > amax) amax = a;
    }
    float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    put_f16(out, d);
    for (int i = 0; i < QK; i++) out[2 + i] = (unsigned char)to_int8(roundf(x[i] * id));
}

static void block_q4_0(const float *x, unsigned char *out) {
    float amax = 0, max = 0;
    for (int i = 0; i < QK; i++) {
        float a = fabsf(x[i]);
        if (a > amax) { /* the first of equal magnitudes, as argmax */
            amax = a;
            max = x[i];
        }
    }
    float d = max / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
    put_f16(out, d);
    for (int j = 0; j < QK / 2; j++) {
        unsigned q0 = to_nibble(truncf(x[j] * id + 8.5f));
        unsigned q1 = to_nibble(truncf(x[j + QK / 2] * id + 8.5f));
        out[2 + j] = (unsigned char)(q0 | q1 << 4);
    }
}

size_t quant_ref_rows(ckpt_dtype to, const float *x, size_t n, unsigned char *out) {
    size_t blocks = n / QK, size = to == CKPT_Q8_0 ? 34 : 18;
    for (size_t b = 0; b < blocks; b++)
        if (to == CKPT_Q8_0)
            block_q8_0(x + b * QK, out + b * size);
        else
            block_q4_0(x + b * QK, out + b * size);
    return blocks * size;
}
